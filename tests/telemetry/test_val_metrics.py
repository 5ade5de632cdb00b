"""Validation metrics (what a run's validation and `asyncrl eval` both log) against
hand-computed numbers and verl's bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from asyncrl.telemetry.val_metrics import best_of, pass_at, prompt_metrics, sizes, validation_metrics
from asyncrl.types import Group, PromptRow, Trajectory

# Every metric here is a float64 sum of at most 8 terms (n <= 8) of values in [0, 1], then a mean
# over at most 3 prompts and maybe a sqrt: rounding stays below ~12 ulp of 1, about 3e-15. 1e-12
# bounds that with room and is far below the smallest gap between a right and a wrong formula in
# these examples (best@2 of [0, 1]: 0.75 expected against 1.0 observed).
TOL = {"rel": 1e-12, "abs": 1e-12}


def group(uid: str, source: str, rewards: list[float]) -> Group:
    """A scored group whose i-th response has i + 1 tokens."""
    row = PromptRow(uid=uid, data_source=source, messages=(), ground_truth="")
    trajs = [Trajectory(f"{uid}/{i}", [1], [2] * (i + 1), [0.0] * (i + 1), [0] * (i + 1), "stop", reward=r)
             for i, r in enumerate(rewards)]
    return Group(uid, row, trajs)


def test_two_responses_scored_0_and_1_by_hand() -> None:
    """k = 2 on rewards [0, 1]: each of the 4 ordered draws (0,0) (0,1) (1,0) (1,1) is equally
    likely, so the best of 2 is 1 in 3 of them (0.75, std sqrt(0.75 * 0.25)) and the worst is 1 in
    1 (0.25); pass@1 = 1/2, pass@2 = 1 - C(1,2)/C(2,2) = 1. The observed best would be 1.0."""
    out = validation_metrics([group("a", "gsm8k", [0.0, 1.0])])
    core, aux = "val-core/gsm8k/reward", "val-aux/gsm8k/reward"
    expected = {f"{core}/mean@2": 0.5, f"{aux}/std@2": 0.5,
                f"{core}/best@2/mean": 0.75, f"{core}/best@2/std": math.sqrt(3) / 4,
                f"{aux}/worst@2/mean": 0.25, f"{aux}/worst@2/std": math.sqrt(3) / 4,
                f"{aux}/pass@1": 0.5, f"{core}/pass@2": 1.0,
                "val/score/mean": 0.5, "val/pass@2": 1.0, "val/response_length/mean": 1.5}
    assert out.keys() == expected.keys()
    for k, v in expected.items():
        assert out[k] == pytest.approx(v, **TOL), k


def test_prompt_metrics_by_hand() -> None:
    m = prompt_metrics([1.0, 0.0, 0.0, 1.0])  # n = 4, two pass
    expected = {"mean@4": 0.5, "std@4": 0.5,
                "best@2/mean": 0.75, "best@2/std": 0.75**0.5 * 0.5,
                "worst@2/mean": 0.25, "worst@2/std": 0.75**0.5 * 0.5,
                "best@4/mean": 1 - 0.5**4, "best@4/std": (0.9375 * 0.0625) ** 0.5,
                "worst@4/mean": 0.5**4, "worst@4/std": (0.9375 * 0.0625) ** 0.5,
                "pass@1": 0.5, "pass@2": 1 - 1 / 6, "pass@4": 1.0}
    assert m.keys() == expected.keys()
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, **TOL), k


def test_partial_scores_and_odd_n() -> None:
    assert sizes(1) == [] and sizes(3) == [2, 3] and sizes(8) == [2, 4, 8] and sizes(10) == [2, 4, 8, 10]
    # sorted [0.1, 0.1, 1.0]: the best of 3 draws is 1.0 unless all three miss it, (2/3)^3
    assert best_of([0.1, 1.0, 0.1], 3)[0] == pytest.approx(0.1 * 8 / 27 + 19 / 27, **TOL)
    assert pass_at([0.1, 1.0, 0.1], 1) == pytest.approx(1 / 3, **TOL)
    assert pass_at([0.1, 1.0, 0.1], 2) == pytest.approx(2 / 3, **TOL)
    assert prompt_metrics([0.7]) == {"mean@1": 0.7, "pass@1": 0.0}


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0], [0.2, 0.9, 0.4]])
def test_best_and_worst_match_verls_bootstrap(rewards: list[float]) -> None:
    """verl draws 1,000 subsets with replacement (`bootstrap_metric`); ours is that draw's expectation.
    With 20,000 draws of a value in [0, 1] (std <= 0.5) the sample mean and std are within
    0.5 / sqrt(20,000) ~ 0.0035 of it per standard error: 0.01 is about 3 of them (seeded)."""
    rng = np.random.RandomState(42)
    for m in sizes(len(rewards)):
        draws = np.array(rewards)[rng.choice(len(rewards), size=(20_000, m), replace=True)]
        mean, std = best_of(rewards, m)
        assert mean == pytest.approx(draws.max(axis=1).mean(), rel=0, abs=0.01)
        assert std == pytest.approx(draws.max(axis=1).std(), rel=0, abs=0.01)


def test_names_and_split_over_sources() -> None:
    out = validation_metrics([group("a", "gsm8k", [1, 0, 0, 1]), group("b", "gsm8k", [0, 0, 0, 0]),
                              group("c", "math", [1, 1, 1, 1])])
    assert out["val-core/gsm8k/reward/mean@4"] == pytest.approx(0.25, **TOL)
    assert out["val-core/gsm8k/reward/best@4/mean"] == pytest.approx(0.9375 / 2, **TOL)
    assert out["val-core/gsm8k/reward/best@4/std"] == pytest.approx((0.9375 * 0.0625) ** 0.5 / 2, **TOL)
    assert out["val-core/gsm8k/reward/pass@4"] == 0.5 and out["val-aux/gsm8k/reward/pass@1"] == 0.25
    assert out["val-aux/gsm8k/reward/best@2/mean"] == pytest.approx(0.375, **TOL)
    assert "val-aux/gsm8k/reward/worst@4/mean" in out and "val-aux/gsm8k/reward/std@4" in out
    assert out["val-core/math/reward/mean@4"] == 1.0
    assert out["val/score/mean"] == pytest.approx(0.5, **TOL)
    assert out["val/pass@4"] == pytest.approx(2 / 3, **TOL)
    assert out["val/response_length/mean"] == 2.5


def test_no_groups_no_metrics() -> None:
    assert validation_metrics([]) == {}
