"""The freshness budget against hand-computed counts."""

from __future__ import annotations

import pytest

from asyncrl.scheduling.staleness import StalenessBudget


@pytest.mark.parametrize("R, T, threshold, per_version", [
    (4, 1, 0.0, 4), (4, 2, 0.0, 8), (4, 2, 0.5, 12), (4, 1, 1.0, 8), (3, 1, 0.34, 4), (2, 3, 0.1, 6)])
def test_per_version(R, T, threshold, per_version):
    assert StalenessBudget(R, T, threshold).per_version == per_version


def test_threshold_zero_starts_exactly_R_times_T_per_version():
    b = StalenessBudget(4, 2, 0.0)
    for _ in range(3):
        starts = 0
        while b.can_start():
            b.on_start()
            starts += 1
        assert starts == 8
        b.on_sync(num_stale=0)


def test_stale_samples_reduce_the_next_budget():
    b = StalenessBudget(4, 2, 0.5)
    for _ in range(12):
        b.on_start()
    assert not b.can_start()
    b.on_sync(num_stale=5)
    assert b.remaining == 7
    with pytest.raises(AssertionError):
        for _ in range(8):
            b.on_start()


def test_lag_cap():
    b = StalenessBudget(1, 1, 1.0, max_version_lag=1)
    assert b.admissible(3, 4) and not b.admissible(2, 4)
    assert StalenessBudget(1, 1, 1.0).admissible(0, 100)


def test_an_abandoned_start_is_given_back():
    b = StalenessBudget(prompts_per_update=2, updates_per_sync=1, staleness_threshold=0.0)
    b.on_start()
    b.on_start()
    assert not b.can_start()
    b.on_abandoned()  # the run stopped while it was generating: it is started again later
    assert b.remaining == 1
    b.on_sync(num_stale=0)
    b.on_abandoned()
    assert b.started == 0 and b.remaining == 2
