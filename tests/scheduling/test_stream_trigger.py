"""The stream trainer's trigger against hand-computed check points and counts."""

from __future__ import annotations

import pytest

from asyncrl.scheduling.stream_trigger import StreamTrigger

EXACT = {"rel": 1e-12, "abs": 1e-12}


def test_check_points_every_five_percent_from_min_to_max_done():
    assert StreamTrigger().check_points() == pytest.approx([0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5], **EXACT)
    assert StreamTrigger(0.2, 0.52, 0.1).check_points() == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.52], **EXACT)
    assert StreamTrigger(0.3, 0.3, 0.05).check_points() == pytest.approx([0.3], **EXACT)


def test_docstring_example_fires_at_the_first_tail_bound_check_point():
    t = StreamTrigger()  # 20 prompts x 8 responses: peak 160, tail-bound below 80 running
    assert [t.observe(0.0, 160), t.observe(0.20, 100), t.observe(0.22, 90)] == [False, False, False]
    assert t.observe(5 / 20, 70) and t.fired_at == pytest.approx(0.25, **EXACT)
    assert t.observe(0.30, 75) and t.peak_running == 160


def test_between_check_points_nothing_is_decided():
    t = StreamTrigger()
    t.observe(0.0, 100)
    assert not t.observe(0.20, 60)  # check point 0.20: 60 >= 50
    assert not t.observe(0.21, 10)  # tail-bound, but 0.25 is not reached yet
    assert t.observe(0.25, 10) and t.fired_at == pytest.approx(0.25, **EXACT)


def test_a_jump_over_several_check_points_is_one_evaluation():
    t = StreamTrigger()
    t.observe(0.0, 100)
    assert not t.observe(0.33, 50)  # check point 0.30 (0.20 and 0.25 skipped): 50 is not < 50
    assert not t.observe(0.34, 49)  # 0.35 not reached
    assert t.observe(0.35, 49) and t.fired_at == pytest.approx(0.35, **EXACT)


def test_waiting_requests_are_not_a_tail_and_max_done_fires_anyway():
    t = StreamTrigger()
    t.observe(0.0, 64, waiting=96)
    for done in (0.20, 0.25, 0.30, 0.35, 0.40, 0.45):
        assert not t.observe(done, 20, waiting=10)  # 20 < 32, but requests still wait for a slot
    assert t.observe(0.5, 64, waiting=5) and t.fired_at == pytest.approx(0.5, **EXACT)


def test_max_done_off_the_grid_and_below_min_done():
    t = StreamTrigger(0.2, 0.52, 0.1, tail_ratio=0.25)
    t.observe(0.0, 100)
    assert not t.observe(0.19999, 1)  # below min_done: no check point
    assert not t.observe(0.50, 30)  # check point 0.5: 30 >= 25
    assert t.observe(0.52, 30) and t.fired_at == pytest.approx(0.52, **EXACT)


def test_reset_starts_a_new_batch():
    t = StreamTrigger()
    t.observe(0.0, 100)
    assert t.observe(0.5, 100)
    t.reset()
    assert not t.fired and t.peak_running == 0
    assert not t.observe(0.2, 40)  # a new peak of 40: 40 is not < 20
    assert t.observe(0.25, 19) and t.fired_at == pytest.approx(0.25, **EXACT)


def test_bad_bounds_are_programmer_errors():
    with pytest.raises(AssertionError):
        StreamTrigger(0.6, 0.5)
    with pytest.raises(AssertionError):
        StreamTrigger(check_every=0.0)
