"""PromptIterator: continuity across epochs and exact resume from state_dict."""

from __future__ import annotations

import pytest

from asyncrl.data.iterator import PromptIterator
from asyncrl.data.tasks import make_task
from asyncrl.errors import DataError

ROWS = make_task("arithmetic", 7)


def _uids(rows: list) -> list[str]:
    return [r.uid for r in rows]


def test_unshuffled_batches_span_epoch_boundary() -> None:
    it = PromptIterator(ROWS[:5], 2, shuffle=False)
    assert _uids(it.next_batch()) == ["train-0", "train-1"]
    assert _uids(it.next_batch()) == ["train-2", "train-3"]
    assert it.epoch == 0
    assert _uids(it.next_batch()) == ["train-4", "train-0"]
    assert it.epoch == 1


def test_each_epoch_is_a_permutation_reshuffled_per_epoch() -> None:
    it = PromptIterator(ROWS, 7, seed=5)
    epochs = [_uids(it.next_batch()) for _ in range(3)]
    assert all(sorted(e) == sorted(_uids(ROWS)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    assert it.epoch == 3


def test_take_and_next_batch_share_one_cursor() -> None:
    a, b = PromptIterator(ROWS, 3, seed=1), PromptIterator(ROWS, 3, seed=1)
    assert _uids(a.take(1) + a.take(2) + a.next_batch()) == _uids(b.next_batch() + b.next_batch())


@pytest.mark.parametrize("consumed", [0, 3, 7, 9, 20])
def test_restore_gives_identical_continuation(consumed: int) -> None:
    it = PromptIterator(ROWS, 3, seed=11)
    it.done(it.take(consumed))
    state = it.state_dict()
    expected = _uids(it.take(25))  # crosses several epoch boundaries
    fresh = PromptIterator(ROWS, 3, seed=0)
    fresh.load_state_dict(state)
    assert _uids(fresh.take(25)) == expected and fresh.epoch == it.epoch


def test_restore_onto_a_different_dataset_size_fails() -> None:
    state = PromptIterator(ROWS, 3).state_dict()
    with pytest.raises(DataError, match="checkpoint"):
        PromptIterator(ROWS[:4], 3).load_state_dict(state)


def test_empty_dataset_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no prompts"):
        PromptIterator([], 3)


def test_outstanding_prompts_are_handed_out_again_after_restore() -> None:
    it = PromptIterator(ROWS, 2, seed=3)
    trained, in_flight = it.next_batch(), it.next_batch()
    it.done(trained)
    dropped = it.next_prompt()
    it.give_back(dropped)
    state = it.state_dict()
    assert state["outstanding"] == _uids(in_flight) + [dropped.uid]
    rest = _uids(it.take(4))  # the dropped prompt first, then the stream
    resumed = PromptIterator(ROWS, 2, seed=3)
    resumed.load_state_dict(state)
    assert _uids(resumed.take(2 + 4)) == _uids(in_flight) + rest
    assert _uids(resumed.outstanding) == _uids(in_flight) + rest


def test_claimed_prompts_are_outstanding_not_replayed() -> None:
    it = PromptIterator(ROWS, 2, seed=3, shuffle=False)
    restored = PromptIterator(ROWS, 2, seed=3, shuffle=False)
    it.take(2)
    restored.load_state_dict(it.state_dict())
    restored.claim(ROWS[0])
    assert _uids(restored.take(2)) == ["train-1", "train-2"]
    assert _uids(restored.outstanding) == ["train-0", "train-1", "train-2"]
