"""What one accuracy cell trained, read from its run directory (issue 38): the run-level partial-rollout
figures and the per-sample lengths and version lags from the sample ledger (`samples.jsonl`), and the
logged metrics' run summary with cumulative counters read by their last value.

Per response the ledger gives its trained length, its version lag and how many versions produced it
(`asyncrl/pipelines/ledger.py`); a cell keeps their summary and a histogram of lengths per lag (8-token
buckets), small enough to commit for every cell and enough for the bias checks: a mode's length
distribution against colocated's (mean, 90th percentile, KS distance) and the lag-length correlation.
Not here: running the cell (`bench/convergence.py`), verdicts (`bench/verdicts.py`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BUCKET = 8
"""Tokens per length-histogram bucket."""
CUMULATIVE = ("fully_async/count/", "fully_async/dropped/")
"""Metric prefixes that count over the run (verl's stale counters): a run's figure is the last value."""
MAXIMA = ("staleness/version_lag_max", "fully_async/partial/max_partial_span")
"""Metrics whose run figure is the largest over the steps."""
DIAGNOSTICS = ("staleness/version_lag_mean", "staleness/version_lag_max", "fully_async/count/stale_samples_processed",
               "fully_async/count/stale_trajectory_processed", "fully_async/partial/partial_ratio",
               "off_policy/is_weight_mean", "off_policy/is_truncated_frac", "actor/ppo_kl", "actor/pg_clipfrac",
               "response_length/mean", "fully_async/count/dropped_stale", "fully_async/dropped/response_length_mean")
"""What explains a gap between modes (issue 26): staleness, partial rollout, off-policy weights, KL, clipping."""


def diagnostics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The run's figure of each of `DIAGNOSTICS` logged: the last value of a cumulative counter, the
    largest of a maximum, the mean over steps of the rest.

    Example: stale_samples_processed 2, 5, 9 over three steps -> 9 (not their mean, 5.33)."""
    out = {}
    for key in DIAGNOSTICS:
        values = [float(r[key]) for r in steps if key in r]
        if values:
            out[key] = (values[-1] if key.startswith(CUMULATIVE) else max(values) if key in MAXIMA
                        else statistics.fmean(values))
    return out


def ledger_stats(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run-level partial and lag figures of a sample ledger's lines, and the trained lengths'
    summary: `partial_ratio` is the share of trained responses produced by more than one version,
    `version_lag_max` the largest lag of a trained response. Lines written before the ledger kept
    per-response fields give the group-level figures only (`per_response` false).

    Example: one group with segments_G [1, 2], lags_G [0, 1], lengths_G [10, 30] -> partial_ratio
    0.5, version_lag_max 1, length_mean 20."""
    if not lines:
        return {"responses": 0, "partial_ratio": 0.0, "version_lag_max": 0}
    if not all("lengths_G" in line for line in lines):
        return {"per_response": False, "groups": len(lines),
                "partial_ratio": statistics.fmean(line["segments"] > 1 for line in lines),
                "version_lag_max": max(line["trained_at_version"] - line["start_version"] for line in lines)}
    lengths = [x for line in lines for x in line["lengths_G"]]
    lags = [x for line in lines for x in line["lags_G"]]
    segments = [x for line in lines for x in line["segments_G"]]
    ordered = sorted(lengths)
    return {"per_response": True, "responses": len(lengths),
            "partial_ratio": sum(s > 1 for s in segments) / len(segments), "version_lag_max": max(lags),
            "version_lag_mean": statistics.fmean(lags), "length_mean": statistics.fmean(lengths),
            "length_p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "lag_length_corr": correlation(lags, lengths), "length_hist_by_lag": histograms(lags, lengths)}


def histograms(lags: Sequence[int], lengths: Sequence[int]) -> dict[str, list[int]]:
    """Per version lag, the count of trained responses in each `BUCKET`-token length bucket."""
    width = max(lengths) // BUCKET + 1
    out: dict[str, list[int]] = {}
    for lag, length in zip(lags, lengths):
        out.setdefault(str(lag), [0] * width)[length // BUCKET] += 1
    return out


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r; None when either side does not vary."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(xs, ys)


def ks_distance(a: Mapping[str, Sequence[int]], b: Mapping[str, Sequence[int]]) -> float:
    """The Kolmogorov-Smirnov distance between two cells' trained-length distributions (their
    histograms over all lags, at bucket resolution). Example: all of a in bucket 0, all of b in
    bucket 1 -> 1.0."""
    ca, cb = cdf(_merged(a)), cdf(_merged(b))
    width = max(len(ca), len(cb))
    return max(abs(_at(ca, i) - _at(cb, i)) for i in range(width))


def _merged(hist: Mapping[str, Sequence[int]]) -> list[int]:
    width = max(len(h) for h in hist.values())
    return [sum(h[i] for h in hist.values() if i < len(h)) for i in range(width)]


def pooled(hists: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, list[int]]:
    """Several cells' length histograms by lag pooled into one over all lags (`ks_distance`'s input).
    Example: [{0: [2, 0], 1: [1, 1]}, {0: [0, 0, 4]}] -> {"all": [3, 1, 4]}."""
    return {"all": _merged({f"{i}/{lag}": h for i, hist in enumerate(hists) for lag, h in hist.items()})}


def cdf(counts: Sequence[int]) -> list[float]:
    """The cumulative shares of a histogram's counts. Example: [3, 1] -> [0.75, 1.0]."""
    total, running, out = sum(counts), 0, []
    for c in counts:
        running += c
        out.append(running / total)
    return out


def _at(cdf: Sequence[float], i: int) -> float:
    return cdf[i] if i < len(cdf) else 1.0


def read_run(out: Path) -> dict[str, Any]:
    """A finished run directory's ledger summary and metric diagnostics."""
    ledger = out / "samples.jsonl"
    lines = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()] if ledger.exists() else []
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"ledger": ledger_stats(lines), "diagnostics": diagnostics([r for r in rows if "timing_s/step" in r])}
