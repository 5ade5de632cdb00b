"""bench/lag_cap.py's summary: paired differences against colocated, dropped lengths only from cells
that dropped, length distributions compared on the same seed."""

from __future__ import annotations

import pytest

from bench.lag_cap import summarize, table


def cell(arm: str, seed: int, score: float, hist: list[int], dropped: float = 0.0, dropped_len: float = 0.0) -> dict:
    diag = {"fully_async/count/dropped_stale": dropped, "fully_async/dropped/response_length_mean": dropped_len}
    points = [{"samples": 720, "score": score}, {"samples": 960, "score": score}]
    return {"arm": arm, "seed": seed, "process_s": 60.0, "points": points, "diagnostics": diag,
            "ledger": {"length_mean": 10.0 * seed + 10, "length_p90": 30, "version_lag_max": 1, "partial_ratio": 0.0,
                       "length_hist_by_lag": {"0": hist}}}


def test_the_summary_pairs_seeds_and_reads_drops_where_they_happened():
    cells = [cell("colocated", 0, 0.5, [4, 4]), cell("colocated", 1, 0.6, [4, 4]),
             cell("drop", 0, 0.4, [8, 0], dropped=3, dropped_len=40.0), cell("drop", 1, 0.6, [4, 4]),
             {"arm": "pace", "seed": 0, "error": "timed out"}]
    s = summarize(cells)
    drop = s["arms"]["drop"]
    assert drop["diff_vs_colocated"] == pytest.approx(-0.05) and drop["diff_sd"] == pytest.approx(0.0707, abs=1e-4)
    assert drop["dropped_groups"] == 1.5 and drop["dropped_length_mean"] == 40.0  # seed 1 dropped nothing
    assert drop["ks_vs_colocated"] == pytest.approx(0.25)  # seed 0: CDFs 1.0 vs 0.5 at the first bucket; seed 1: 0
    assert "pace" not in s["arms"] and "| drop | 2 | 0.500 | -0.050 (0.071) |" in table(s)
