"""Every pipeline runs multi-turn episodes (the tiny model, a fake tool between two model turns):
colocated, one-step-off and fully async, each prompt trained once, episode metrics logged; a
fully async run stopped mid-generation keeps its partial episodes in the checkpoint and
continues them after resume."""

from __future__ import annotations

from collections import Counter

import pytest

from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.stopping import Stopped
from tests.pipelines.helpers import read_jsonl, run_pipeline
from tests.pipelines.test_faults import interrupt

pytestmark = pytest.mark.slow

EPISODES = ["rollout.multi_turn.enable=true", "rollout.multi_turn.episode=tests.agents.fakes:PIPELINE_EPISODE",
            "data.max_response_length=40", "trainer.val_before_train=false", "trainer.test_freq=0",
            "rollout.n=4", "actor.ppo_mini_batch_size=4"]
STEPS = ["data.train_batch_size=4", "trainer.total_training_steps=2"]
FULLY_ASYNC = ["pipeline=fully_async", "data.train_batch_size=8", "rollout.total_rollout_steps=16",
               "async_training.staleness_threshold=1.0", "async_training.partial_rollout=true",
               "trainer.save_freq=2"]


def prompts_once(out, total: int) -> None:
    counts = Counter(s["prompt"] for s in read_jsonl(out / "samples.jsonl"))
    assert sum(counts.values()) == total and max(counts.values()) == 1, counts.most_common(3)


def assert_episodes_ran(rows: list[dict]) -> None:
    steps = [r for r in rows if "num_turns/mean" in r]
    assert steps and all(r["tool_calls/mean"] > 0 and r["num_turns/max"] <= 4 for r in steps)
    assert max(r["num_turns/max"] for r in steps) == 4  # 2 model turns + 1 tool message + the prompt


@pytest.mark.parametrize("pipeline", ["colocated", "one_step_off"])
def test_synchronous_pipelines_run_episodes(tiny_cache, tmp_path, pipeline):
    rows = run_pipeline(tmp_path, *EPISODES, *STEPS, f"pipeline={pipeline}")
    assert_episodes_ran(rows)
    prompts_once(tmp_path, 8)


def test_fully_async_runs_episodes_and_resumes_partial_ones(tiny_cache, tmp_path):
    overrides = [*EPISODES, *FULLY_ASYNC]
    assert interrupt(tmp_path, overrides, "generation", 10) is Stopped
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    parked = [t for g in state["pipeline"].get("parked", []) for t in g.trajectories]
    assert parked and any(t.finish_reason == "aborted" for t in parked)
    assert all(len(t.loss_mask) == len(t.response_ids) == len(t.versions) for t in parked if t.response_ids)
    rows = run_pipeline(tmp_path, *overrides)
    assert_episodes_ran(rows)
    assert max(r.get("fully_async/partial/continuations", 0) for r in rows) > 0
    prompts_once(tmp_path, 16)
