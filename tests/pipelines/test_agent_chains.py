"""An agent that edits its history trains one sequence per chain in every pipeline, while groups,
staleness and the ledger count its episode once (AReaL's rule, docs/agents.md)."""

from __future__ import annotations

import pytest

from tests.pipelines.helpers import run_pipeline
from tests.pipelines.test_episodes import prompts_once

pytestmark = pytest.mark.slow
PROMPTS, N, STEPS = 4, 2, 2
RUN = ("rollout.agent.entrypoint=tests.agents.gateway.agents:edits_history", "data.max_response_length=40",
       f"data.train_batch_size={PROMPTS}", f"rollout.n={N}", f"actor.ppo_mini_batch_size={PROMPTS}",
       f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false", "trainer.test_freq=0")
FULLY_ASYNC = ("pipeline=fully_async", f"rollout.total_rollout_steps={PROMPTS * STEPS}",
               "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true")
MODES = {"colocated": (), "one_step_off": ("pipeline=one_step_off",), "fully_async": FULLY_ASYNC}


@pytest.mark.parametrize("mode", MODES)
def test_each_chain_is_a_trained_sequence_and_each_episode_counts_once(tiny_cache, tmp_path, mode):
    rows = [r for r in run_pipeline(tmp_path, *RUN, *MODES[mode]) if "agent/chains" in r]
    assert len(rows) == STEPS
    for r in rows:
        assert r["training/responses"] == PROMPTS * N  # the groups: rollout.n episodes of a row
        assert r["agent/chains"] == r["training/sequences"] == 2 * PROMPTS * N, r  # both chains trained
        assert r["agent/calls"] == 2 * PROMPTS * N and r["agent/retokenized_tokens"] == 0, r
        assert r["critic/rewards/mean"] == pytest.approx(0.75), r  # every chain has its episode's reward
    prompts_once(tmp_path, PROMPTS * STEPS)
