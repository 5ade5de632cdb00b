"""bench/tool_task.py's arithmetic: validation points from metrics rows, and the verdicts against the targets."""

from __future__ import annotations

import pytest

from bench.tool_task import overrides, parse, summarize, validations


def test_validations_count_updates_and_training_wall_time() -> None:
    rows = [{"step": 0, "timing_s/testing": 2.0, "val/score/mean": 0.3},
            {"step": 1, "timing_s/step": 5.0},
            {"step": 2, "timing_s/step": 4.0, "timing_s/testing": 1.0, "val/score/mean": 0.6}]
    assert validations(rows) == [{"updates": 0, "wall_s": 2.0, "accuracy": 0.3},
                                 {"updates": 2, "wall_s": 12.0, "accuracy": 0.6}]


def test_summary_takes_medians_over_seeds_and_checks_both_targets() -> None:
    results = [{"mode": "no_tool", "seed": 0, "final": 0.02},
               {"mode": "colocated", "seed": 0, "initial": 0.35, "final": 0.60},
               {"mode": "colocated", "seed": 1, "initial": 0.40, "final": 0.50},
               {"mode": "colocated", "seed": 2, "initial": 0.30, "final": 0.70},
               {"mode": "fully_async", "seed": 0, "initial": 0.35, "final": 0.45},
               {"mode": "fully_async", "seed": 1, "error": "exit status 1"}]
    s = summarize(results)
    # colocated rises 0.25, 0.10, 0.40 -> median 0.25; final median 0.60 = 0.58 over no-tool
    assert s["colocated"]["rise"] == pytest.approx(0.25, rel=1e-12, abs=1e-12) and s["colocated"]["rise_met"]
    assert s["colocated"]["over_no_tool"] == pytest.approx(0.58, rel=1e-12, abs=1e-12)
    assert s["colocated"]["over_no_tool_met"]
    assert s["fully_async"]["seeds"] == [0] and not s["fully_async"]["rise_met"]  # the failed seed is left out


def test_every_cell_runs_the_tool_task_with_episodes() -> None:
    args = parse(["--steps", "4", "--batch", "8"])
    keys = overrides("fully_async", 1, args)
    assert {"model.path=tiny-tools", "data.task=long_addition", "rollout.multi_turn.enable=true",
            "rollout.multi_turn.format=compact", "pipeline=fully_async", "rollout.total_rollout_steps=32",
            "seed=1"} <= set(keys)
    assert "trainer.total_training_steps=4" in overrides("colocated", 0, args)
