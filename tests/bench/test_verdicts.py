"""bench/verdicts.py: Student's t, Holm, and each verdict on synthetic paired differences."""

from __future__ import annotations

import pytest

from bench.verdicts import (
    endpoint,
    holm,
    plateau_slope,
    relative_margin,
    seeds_needed,
    t_quantile,
    t_sf,
    verdict,
)


def test_student_t_matches_the_tables() -> None:
    # t tables: 97.5% at 4 df 2.776, 95% at 9 df 1.833, 99.5% at 20 df 2.845, 95% at 1 df 6.314
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, rel=1e-4, abs=1e-4)
    assert t_quantile(0.95, 9) == pytest.approx(1.8331, rel=1e-4, abs=1e-4)
    assert t_quantile(0.995, 20) == pytest.approx(2.8453, rel=1e-4, abs=1e-4)
    assert t_quantile(0.95, 1) == pytest.approx(6.3138, rel=1e-4, abs=1e-4)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, rel=1e-4, abs=1e-4)
    assert t_sf(2.776, 4) == pytest.approx(0.025, rel=1e-3, abs=1e-5)
    assert t_sf(0.0, 5) == pytest.approx(0.5, rel=1e-12, abs=1e-12)
    assert t_sf(-2.776, 4) == pytest.approx(0.975, rel=1e-4, abs=1e-5)


def test_holm_steps_down_and_stays_monotone() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06}, rel=1e-12, abs=1e-12)


def check(diffs: list[float], p_adjusted: float | None = None) -> dict:
    return verdict(diffs, 0.05, alpha=0.05, p_adjusted=p_adjusted, planned_sd=0.02)


def test_equivalent_is_tost_at_the_margin() -> None:
    v = check([0.01, -0.01, 0.0, 0.02, -0.02])
    # sd 0.0158, 90% half-width 2.132 x 0.0158 / sqrt(5) = 0.0151: inside +-0.05
    assert v["verdict"] == "equivalent"
    assert v["ci"] == pytest.approx([-0.015074, 0.015074], rel=1e-4, abs=1e-6)
    # a significant difference inside the margin stays "equivalent", and says so
    small = check([-0.01, -0.012, -0.008, -0.011, -0.009] * 2)
    assert small["verdict"] == "equivalent" and "inside the margin" in small["note"]


def test_not_worse_when_the_interval_reaches_past_the_upper_margin() -> None:
    v = check([0.10, -0.02, 0.09, -0.01, 0.08, 0.0, 0.07, -0.015])
    # 90% interval [+0.002, +0.072]: above -0.05 but past +0.05, and not significant two-sided (p 0.087)
    assert v["verdict"] == "not worse" and v["ci"][1] > 0.05 and v["p_two_sided"] > 0.05


def test_better_and_worse_are_two_sided_and_holm_adjusted() -> None:
    assert check([0.10, 0.12, 0.09, 0.11, 0.10, 0.08])["verdict"] == "better"
    assert check([-0.10, -0.12, -0.09, -0.11, -0.10, -0.08])["verdict"] == "worse"
    # a worse mean whose Holm-adjusted p misses alpha is no "worse"
    drift = [-0.02, -0.09, -0.03, -0.08, -0.05, -0.01, -0.07]
    assert check(drift)["verdict"] == "worse" and check(drift, p_adjusted=0.2)["verdict"] == "inconclusive"


def test_inconclusive_says_why_with_the_observed_and_planned_spread() -> None:
    v = check([0.1, -0.1, 0.05, -0.08, 0.02])
    assert v["verdict"] == "inconclusive"
    assert "observed paired sd 0.086 against the planned 0.020 (4.3x)" in v["why"] and "5 ran" in v["why"]
    assert check([0.01])["verdict"] == "inconclusive"


def test_seeds_for_ninety_percent_power() -> None:
    assert seeds_needed(0.02, 0.03) == 7
    assert seeds_needed(0.036, 0.03, alpha=0.045) > seeds_needed(0.02, 0.03, alpha=0.045)


CURVE = [{"samples": 0, "score": 0.2}, {"samples": 100, "score": 0.4}, {"samples": 200, "score": 0.5}]


def test_the_margin_is_the_smaller_of_15_percent_of_the_rise_and_20_percent_fewer_samples() -> None:
    assert endpoint(CURVE, (100, 200)) == pytest.approx(0.45, rel=1e-12, abs=1e-12)
    m = relative_margin(CURVE, (200, 200), 0.15, 0.2)
    # rise 0.3 -> 0.045; at 160 prompts the curve reads 0.46, 0.04 below the endpoint
    assert (m["from_rise"], m["from_fewer_samples"], m["margin"]) == pytest.approx((0.045, 0.04, 0.04),
                                                                                   rel=1e-9, abs=1e-12)
    assert relative_margin(CURVE, (200, 200), 0.15, None)["margin"] == pytest.approx(0.045, rel=1e-9, abs=1e-12)


def test_plateau_is_a_slope_interval_that_holds_zero() -> None:
    def run(scores: list[float]) -> list[dict]:
        return [{"samples": 100 * (i + 1), "score": s} for i, s in enumerate(scores)]

    flat = plateau_slope([run([0.5, 0.52, 0.5]), run([0.5, 0.48, 0.5]), run([0.51, 0.5, 0.49])], (100, 300))
    assert flat["flat"] and flat["slope_per_100"] == pytest.approx(-0.01 / 3, rel=1e-9, abs=1e-12)
    rising = plateau_slope([run([0.4, 0.45, 0.5]), run([0.41, 0.45, 0.49]), run([0.4, 0.46, 0.5])], (100, 300))
    assert not rising["flat"] and rising["ci"][0] > 0
