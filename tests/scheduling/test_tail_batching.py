"""Tail batching's rounds against hand-computed shapes."""

from __future__ import annotations

import pytest

from asyncrl.scheduling.tail_batching import Round, TailBatcher


@pytest.mark.parametrize("P0, R0, eta_p, eta_r, launch", [
    (8, 4, 1.25, 1.25, (10, 5)), (8, 8, 1.25, 1.25, (10, 10)), (3, 2, 1.5, 1.0, (5, 2)),
    (4, 4, 1.0, 1.0, (4, 4)), (5, 3, 1.1, 1.34, (6, 5))])
def test_short_round_speculates(P0, R0, eta_p, eta_r, launch):
    r = TailBatcher(P0, R0, eta_p, eta_r).next_round()
    assert r == Round("short", *launch, P0, R0)


def test_long_round_when_the_queue_holds_a_batch_then_short_again():
    b: TailBatcher[str] = TailBatcher(8, 4)
    for k in range(4):
        assert b.next_round().kind == "short"
        b.enqueue([f"p{k}a", f"p{k}b"])
    assert b.next_round() == Round("long", 8, 4, 8, 4)
    assert b.take_long() == ["p0a", "p0b", "p1a", "p1b", "p2a", "p2b", "p3a", "p3b"]
    assert len(b.queue) == 0 and b.next_round().kind == "short"


def test_long_round_takes_exactly_P0_oldest_and_keeps_the_rest_queued():
    b: TailBatcher[int] = TailBatcher(3, 2)
    b.enqueue([1, 2])
    assert b.next_round().kind == "short"
    b.enqueue([3, 4])
    assert b.take_long() == [1, 2, 3]
    assert list(b.queue) == [4]


def test_take_long_without_a_full_queue_is_a_programmer_error():
    b: TailBatcher[int] = TailBatcher(3, 2)
    b.enqueue([1])
    with pytest.raises(AssertionError):
        b.take_long()
