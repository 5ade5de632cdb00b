"""bench/cell_stats.py: a cell's partial-rollout figures and trained lengths from the sample ledger,
and cumulative counters read by their last value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.data.tasks import make_task
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.types import Group, Trajectory
from bench.cell_stats import cdf, diagnostics, ks_distance, ledger_stats, pooled


def test_cumulative_counters_are_read_by_their_last_value() -> None:
    steps = [{"fully_async/count/stale_samples_processed": v, "staleness/version_lag_max": lag,
              "actor/ppo_kl": kl} for v, lag, kl in ((2, 1, 0.1), (5, 2, 0.2), (9, 1, 0.3))]
    d = diagnostics(steps)
    assert d["fully_async/count/stale_samples_processed"] == 9  # not the mean 5.33 of a running total
    assert d["staleness/version_lag_max"] == 2
    assert d["actor/ppo_kl"] == pytest.approx(0.2, rel=1e-12, abs=1e-12)


def trajectory(uid: str, length: int, versions: list[int]) -> Trajectory:
    return Trajectory(uid, [1], [5] * length, [0.0] * length, versions, "stop")


def test_the_ledger_gives_per_response_lengths_lags_and_the_partial_ratio(tmp_path: Path) -> None:
    rows = make_task("arithmetic", 2)
    ledger = SampleLedger(tmp_path / "samples.jsonl")
    # update 1 trains at version 3: a response continued over two versions (3 tokens under 1, 1 under 2)
    # and one produced under 3; update 2 at version 4: two responses of version 2 (lag 2), one continued
    ledger.record([Group(uid="a", row=rows[0], trajectories=[trajectory("a/0", 4, [1, 1, 1, 2]),
                                                              trajectory("a/1", 10, [3] * 10)])], step=1, version=3)
    ledger.record([Group(uid="b", row=rows[1], trajectories=[trajectory("b/0", 20, [2] * 19 + [3]),
                                                              trajectory("b/1", 2, [2, 2])])], step=2, version=4)
    ledger.close()
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert lines[0]["lengths_G"] == [4, 10] and lines[0]["lags_G"] == [2, 0] and lines[0]["segments_G"] == [2, 1]
    s = ledger_stats(lines)
    assert (s["responses"], s["partial_ratio"], s["version_lag_max"]) == (4, 0.5, 2)
    assert s["length_mean"] == pytest.approx(9.0, rel=1e-12, abs=1e-12) and s["length_p90"] == 20
    assert s["length_hist_by_lag"] == {"2": [2, 0, 1], "0": [0, 1, 0]}  # 8-token buckets
    # lines from before the ledger kept per-response fields: the group-level figures
    old = [{k: v for k, v in line.items() if not k.endswith("_G")} for line in lines]
    assert ledger_stats(old) == {"per_response": False, "groups": 2, "partial_ratio": 1.0, "version_lag_max": 2}
    assert ledger_stats([])["partial_ratio"] == 0.0


def test_ks_distance_of_length_histograms() -> None:
    assert ks_distance({"0": [4, 0]}, {"0": [0, 2], "1": [0, 2]}) == pytest.approx(1.0, rel=1e-12, abs=1e-12)
    assert ks_distance({"0": [1, 1]}, {"0": [2, 2]}) == pytest.approx(0.0, rel=1e-12, abs=1e-12)
    assert ks_distance({"0": [3, 1]}, {"0": [1, 3]}) == pytest.approx(0.5, rel=1e-12, abs=1e-12)


def test_histograms_pool_over_cells_and_lags() -> None:
    assert pooled([{"0": [2, 0], "1": [1, 1]}, {"0": [0, 0, 4]}]) == {"all": [3, 1, 4]}  # the docstring's example
    assert cdf([3, 1]) == [0.75, 1.0]
    # two runs drifting apart each way: far apart seed by seed, the same distribution pooled
    a, b = [{"0": [4, 0]}, {"0": [0, 4]}], [{"0": [0, 4]}, {"0": [4, 0]}]
    assert [ks_distance(x, y) for x, y in zip(a, b)] == [1.0, 1.0]
    assert ks_distance(pooled(a), pooled(b)) == 0.0
