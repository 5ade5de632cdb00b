"""The verdicts of a pre-registered accuracy study (issue 38), as pure functions of paired per-seed
differences (arm - colocated endpoint score, one per seed).

A verdict means what its name says:
- "equivalent": TOST at the margin, both one-sided tests at `alpha` (the 1 - 2 alpha interval
  lies inside [-margin, +margin]);
- "better" / "worse": the two-sided test of a zero difference, Holm-adjusted over the arms of one
  task, rejects at `alpha`, and the arm is not equivalent (a significant difference inside the
  margin is reported beside "equivalent", not instead of it);
- "not worse": one-sided non-inferiority at `alpha` (the lower bound above -margin) where neither
  of the above holds;
- "inconclusive": none of these, with why (too few seeds, or the observed spread against the
  planned one and the seeds it would need).

Also here: the relative margin (`relative_margin`), the plateau check of colocated's slope over
the endpoint window (`plateau_slope`) and the seeds for a planned power (`seeds_needed`). Student's
t comes from the regularized incomplete beta function (no scipy). Not here: reading cells, the
protocol file (`bench/protocol.py`), running anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Verdict = str
"""One of "equivalent", "not worse", "better", "worse", "inconclusive"."""


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom. Example: t_sf(2.776, 4) = 0.025."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(q: float, df: int) -> float:
    """The t with P(T <= t) = q (bisection). Example: t_quantile(0.975, 4) = 2.776."""
    assert 0.0 < q < 1.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    low, high = 0.0, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_sf(mid, df) > 1.0 - q else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Paired:
    """Paired per-seed differences: count, mean, standard deviation and standard error."""

    n: int
    mean: float
    sd: float

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    def interval(self, level: float) -> tuple[float, float]:
        """The two-sided `level` t-interval of the mean difference."""
        half = t_quantile(0.5 + level / 2, self.n - 1) * self.se
        return self.mean - half, self.mean + half

    def p_above(self, bound: float) -> float:
        """One-sided p of H0 mean <= bound (against mean > bound)."""
        return t_sf(_t(self.mean - bound, self.se), self.n - 1)

    def p_below(self, bound: float) -> float:
        """One-sided p of H0 mean >= bound (against mean < bound)."""
        return t_sf(_t(bound - self.mean, self.se), self.n - 1)

    def p_two_sided(self) -> float:
        return min(1.0, 2.0 * t_sf(_t(abs(self.mean), self.se), self.n - 1))


def _t(distance: float, se: float) -> float:
    """distance / se, with a spread of exactly 0 (identical runs) read as certainty either way."""
    if se > 0:
        return distance / se
    return math.inf if distance > 0 else -math.inf if distance < 0 else 0.0


def paired(diffs: Sequence[float]) -> Paired:
    assert len(diffs) >= 2, "a paired test needs 2 seeds or more"
    return Paired(len(diffs), statistics.fmean(diffs), statistics.stdev(diffs))


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values. Example: {a: 0.01, b: 0.04, c: 0.03} -> a 0.03, c 0.06, b 0.06."""
    order = sorted(p_values, key=lambda k: p_values[k])
    adjusted, running = {}, 0.0
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[key]))
        adjusted[key] = running
    return adjusted


def seeds_needed(sd: float, margin: float, alpha: float = 0.05, power: float = 0.9) -> int:
    """Seeds for TOST at `margin` to reach `power` when the true difference is 0 and the paired spread
    is `sd`: the smallest n with (t(1-alpha) + t(1-(1-power)/2)) x sd / sqrt(n) <= margin, n-1 df.
    Example: sd 0.02, margin 0.03, alpha 0.05, power 0.9 -> 7."""
    for n in range(3, 10_000):
        if (t_quantile(1 - alpha, n - 1) + t_quantile(1 - (1 - power) / 2, n - 1)) * sd / math.sqrt(n) <= margin:
            return n
    return 10_000


def verdict(diffs: Sequence[float], margin: float, *, alpha: float, p_adjusted: float | None,
            planned_sd: float, power: float = 0.9) -> dict[str, Any]:
    """The verdict on one arm's paired differences at `margin` (see the module docstring).
    `p_adjusted` is this arm's Holm-adjusted two-sided p within its task (`holm` over the task's
    `p_two_sided`); None reads as the unadjusted one.

    Example: diffs [0.01, -0.01, 0.0, 0.02, -0.02], margin 0.05, alpha 0.05: 90% interval
    [-0.0151, +0.0151] inside +-0.05 -> "equivalent"."""
    if len(diffs) < 2:
        return {"n": len(diffs), "verdict": "inconclusive", "why": f"{len(diffs)} paired seed(s): a test needs 2"}
    d = paired(diffs)
    p_two = d.p_two_sided()
    p_adj = p_two if p_adjusted is None else p_adjusted
    p_not_worse, p_not_better = d.p_above(-margin), d.p_below(margin)
    out = {"n": d.n, "mean_diff": d.mean, "sd": d.sd, "ci_level": 1 - 2 * alpha, "ci": list(d.interval(1 - 2 * alpha)),
           "ci_two_sided": list(d.interval(1 - alpha)), "margin": margin, "p_two_sided": p_two, "p_holm": p_adj,
           "p_not_worse": p_not_worse, "p_equivalence": max(p_not_worse, p_not_better)}
    if max(p_not_worse, p_not_better) < alpha:
        name = "equivalent"
        if p_adj < alpha:
            out["note"] = f"a difference of {d.mean:+.3f} is significant but inside the margin"
    elif p_adj < alpha:
        name = "better" if d.mean > 0 else "worse"
    elif p_not_worse < alpha:
        name = "not worse"
    else:
        name, out["why"] = "inconclusive", inconclusive_why(d, margin, alpha, planned_sd, power)
    return {**out, "verdict": name}


def inconclusive_why(d: Paired, margin: float, alpha: float, planned_sd: float, power: float) -> str:
    """Why no verdict: the observed paired spread against the planned one, and the seeds it would need."""
    need = seeds_needed(d.sd, margin, alpha, power)
    low, high = d.interval(1 - 2 * alpha)
    return (f"{1 - 2 * alpha:.0%} interval [{low:+.3f}, {high:+.3f}] crosses the margin +-{margin:.3f}; "
            f"observed paired sd {d.sd:.3f} against the planned {planned_sd:.3f} ({d.sd / planned_sd:.1f}x): "
            f"at that spread {need} seeds give {power:.0%} power, {d.n} ran")


def endpoint(points: Sequence[Mapping[str, float]], window: tuple[float, float]) -> float:
    """A run's (or a mean curve's) primary endpoint: the mean score of its validations whose trained
    prompt count lies in `window` (inclusive). Example: scores 0.2, 0.4, 0.5 at 0, 100, 200 prompts,
    window (100, 200) -> 0.45."""
    scores = [p["score"] for p in points if window[0] <= p["samples"] <= window[1]]
    assert scores, f"no validation in the endpoint window {window}"
    return statistics.fmean(scores)


def _score_at(points: Sequence[Mapping[str, float]], samples: float) -> float:
    """The curve's score at `samples` trained prompts, linear between validations."""
    for a, b in zip(points, points[1:]):
        if a["samples"] <= samples <= b["samples"]:
            w = (samples - a["samples"]) / (b["samples"] - a["samples"]) if b["samples"] > a["samples"] else 0.0
            return a["score"] + w * (b["score"] - a["score"])
    return points[0]["score"] if samples < points[0]["samples"] else points[-1]["score"]


def relative_margin(curve: Sequence[Mapping[str, float]], window: tuple[float, float], rise_fraction: float,
                    fewer_samples: float | None) -> dict[str, Any]:
    """The margin from colocated's mean curve: `rise_fraction` of its rise (endpoint - score before
    training), or, if smaller and `fewer_samples` is set, the score lost by training that fraction
    fewer prompts (the endpoint read off the same curve at (1 - fewer_samples) x each window point).

    Example: scores 0.2, 0.4, 0.5 at 0, 100, 200 prompts, window (200, 200), 0.15 and 0.2: rise 0.3
    -> 0.045; 20% fewer (160 prompts) reads 0.46, a loss of 0.04 -> margin 0.04."""
    end = endpoint(curve, window)
    rise = end - curve[0]["score"]
    out: dict[str, Any] = {"rise": rise, "from_rise": rise_fraction * rise}
    candidates = [out["from_rise"]]
    if fewer_samples is not None:
        shifted = [(1 - fewer_samples) * p["samples"] for p in curve if window[0] <= p["samples"] <= window[1]]
        out["from_fewer_samples"] = end - statistics.fmean(_score_at(curve, s) for s in shifted)
        candidates.append(out["from_fewer_samples"])
    out["margin"] = min(candidates)
    return out


def plateau_slope(runs: Sequence[Sequence[Mapping[str, float]]], window: tuple[float, float],
                  alpha: float = 0.05) -> dict[str, Any]:
    """Colocated's score slope over the endpoint window, per 100 trained prompts: each seed's
    least-squares slope, their mean and its 1 - alpha interval; `flat` when the interval holds 0."""
    slopes = [_slope([p for p in r if window[0] <= p["samples"] <= window[1]]) for r in runs]
    if len(slopes) < 2:
        return {"n": len(slopes), "flat": False, "why": "fewer than 2 seeds"}
    d = paired(slopes)
    low, high = d.interval(1 - alpha)
    return {"n": d.n, "slope_per_100": d.mean, "ci": [low, high], "flat": low <= 0.0 <= high}


def _slope(points: Sequence[Mapping[str, float]]) -> float:
    xs, ys = [p["samples"] / 100 for p in points], [p["score"] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    assert sxx > 0, "a slope needs 2 validations or more in the window"
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
