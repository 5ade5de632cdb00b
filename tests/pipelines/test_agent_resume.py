"""A fully async agent run (`rollout.agent.entrypoint`, the tiny model) stopped with agents in
flight resumes: the stopped episodes restart from their rows (an agent cannot be checkpointed)
and every prompt is trained exactly once (the sample ledger)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.stopping import Stopped
from tests.agents.gateway import agents
from tests.pipelines.helpers import make_context, read_jsonl
from tests.pipelines.test_episodes import prompts_once

pytestmark = pytest.mark.slow
RUN = ["rollout.agent.entrypoint=tests.agents.gateway.agents:two_calls", "data.max_response_length=40",
       "trainer.val_before_train=false", "trainer.test_freq=0", "rollout.n=4", "actor.ppo_mini_batch_size=4",
       "pipeline=fully_async", "data.train_batch_size=8", "rollout.total_rollout_steps=24",
       "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true", "trainer.save_freq=2"]


def test_a_stopped_agent_run_restarts_its_episodes_and_trains_each_prompt_once(tiny_cache, tmp_path, monkeypatch):
    ctx = make_context(tmp_path, *RUN)
    calls = []

    def stop_at_call_120() -> None:  # after the first update (48 episodes, 2 calls each)
        calls.append(1)
        if len(calls) == 120:
            ctx.stop.request(signal.SIGTERM)

    monkeypatch.setattr(agents, "BEFORE_CALL", [stop_at_call_120])
    with pytest.raises(Stopped):
        asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    parked = [t for g in state["pipeline"].get("parked", []) for t in g.trajectories if t.finish_reason == "aborted"]
    assert parked  # episodes in flight at the stop

    monkeypatch.setattr(agents, "BEFORE_CALL", [])
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(make_context(tmp_path, *RUN)))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert sum(r.get("agent/restarts", 0) for r in rows) == len(parked)
    assert all(r["agent/retokenized_tokens"] == 0 and r["agent/errors"] == 0 for r in rows if "agent/calls" in r)
    prompts_once(tmp_path, 24)
