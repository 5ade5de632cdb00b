"""AdaptiveTimeout against the hand-computed worked example of its docstring."""

from __future__ import annotations

import pytest

from asyncrl.scheduling.adaptive_timeout import AdaptiveTimeout


def test_worked_example() -> None:
    policy = AdaptiveTimeout(lam=1.5, lo=2.0, hi=30.0)
    assert policy.timeout("a") == 30.0
    assert policy.mean_timeout() == 30.0
    policy.update("a", 4.0, True)
    assert policy.timeout("a") == pytest.approx(6.0, rel=1e-9, abs=1e-12)
    policy.update("a", 10.0, False)
    policy.update("a", 3.0, True)
    assert policy.timeout("a") == pytest.approx(6.0, rel=1e-9, abs=1e-12)
    policy.update("b", 0.5, True)
    policy.update("c", 25.0, True)
    assert policy.timeout("b") == pytest.approx(2.0, rel=1e-9, abs=1e-12)
    assert policy.timeout("c") == pytest.approx(30.0, rel=1e-9, abs=1e-12)
    assert policy.mean_timeout() == pytest.approx(38.0 / 3, rel=1e-9, abs=1e-12)


def test_a_longer_correct_run_raises_the_anchor() -> None:
    policy = AdaptiveTimeout(lam=2.0, lo=1.0, hi=100.0)
    policy.update(("p", 0), 3.0, True)
    policy.update(("p", 0), 7.0, True)
    assert policy.timeout(("p", 0)) == pytest.approx(14.0, rel=1e-9, abs=1e-12)
    assert policy.timeout(("p", 1)) == 100.0
