"""The tool task learns (issue 28): tiny-tools in colocated, with episodes that call the calculator;
the validation accuracy (sampled, with the tool) rises from its value after the warm-up. The other
pipelines and seeds are in bench/tool_task.py."""

from __future__ import annotations

import pytest

from tests.pipelines.helpers import run_pipeline, val_scores

pytestmark = pytest.mark.slow


def test_tool_task_reward_rises(tiny_tools_cache, tmp_path):
    rows = run_pipeline(tmp_path, "model.path=tiny-tools", "data.task=long_addition", "data.max_prompt_length=80",
                        "data.max_response_length=96", "rollout.multi_turn.enable=true",
                        "rollout.multi_turn.format=compact", "trainer.total_training_steps=10", "trainer.test_freq=10",
                        "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=8", "data.val_size=32",
                        "trainer.save_freq=0")
    val = val_scores(rows)
    calls = [r["tool_calls/mean"] for r in rows if "tool_calls/mean" in r]
    assert len(val) == 2 and val[1] >= val[0] + 0.08, val
    assert len(calls) == 10 and min(calls) > 0.5, calls  # the episodes called the tool
