"""The one-step-off pipeline on Ray (rollout and trainer in separate processes): every batch
is exactly one update stale, and it learns."""

from __future__ import annotations

import pytest

from tests.pipelines.helpers import run_pipeline, val_scores

pytestmark = pytest.mark.slow


def test_one_step_stale_and_learns_on_ray(tiny_cache, ray_cluster, tmp_path):
    rows = run_pipeline(tmp_path, "pipeline=one_step_off", "backend=ray", "trainer.total_training_steps=40",
                        "trainer.test_freq=20")
    steps = [r for r in rows if r["step"] > 0 and "staleness/version_lag_max" in r]
    assert len(steps) == 40
    assert steps[0]["staleness/version_lag_max"] == 0  # batch 1: generated before any update
    assert all(r["staleness/version_lag_mean"] == 1 == r["staleness/version_lag_max"] for r in steps[1:])
    assert all("timing_s/wait_prev_gen" in r and "timing_s/generate_sequences" in r for r in steps)
    val = val_scores(rows)
    assert max(val[1:]) >= val[0] + 0.05 and sum(val[1:]) / len(val[1:]) >= val[0] + 0.03, val
