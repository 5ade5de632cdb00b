"""A fully async agent run (`rollout.agent.entrypoint`, the tiny model) stopped with agents in
flight (SIGTERM, or SIGKILL in a child process) resumes: the stopped episodes restart from their
rows (an agent cannot be checkpointed) and every prompt is trained exactly once (the sample ledger)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.setup import build_context
from asyncrl.pipelines.stopping import Stopped
from tests.agents.gateway import agents
from tests.pipelines import test_signals as signals
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


def test_a_sigkilled_agent_run_resumes_and_trains_each_prompt_once(tiny_cache, tmp_path):
    """SIGKILL (no checkpoint at the kill): the episodes in flight at the last checkpoint are its
    prompts handed out and not trained; the resumed run starts them again from their rows (its
    log counts them), drops what the killed run trained after the checkpoint, and trains every
    prompt once."""
    out = tmp_path / "run"
    agent = f"rollout.agent.entrypoint={Path(agents.__file__)}:two_calls"
    extra = [agent, "data.max_response_length=40", "async_training.staleness_threshold=0.5",
             "async_training.partial_rollout=true", "trainer.save_freq=2"]
    proc = signals.start(out, *extra)
    signals.wait_for(lambda: latest_checkpoint(out) is not None and signals.steps_logged(out) >= 3, proc, out)
    proc.kill()
    proc.wait(timeout=60)
    state = load_checkpoint_state(latest_checkpoint(out))
    in_flight = state["prompts"]["outstanding"]
    assert in_flight and state["pipeline"].get("parked", []) == []  # a periodic checkpoint parks nothing
    after = [s for s in read_jsonl(out / "samples.jsonl") if s["step"] > state["step"]]  # trained, then lost

    lines: list[str] = []
    cfg = load_config(None, [*signals.RUN, *extra, f"trainer.output_dir={out}",
                             f"rollout.total_rollout_steps={state['trained'] + 8}"])
    asyncio.run(pipeline_module(cfg.pipeline).run(build_context(cfg, log=lines.append)))
    assert any(f"{len(in_flight)} prompts handed out and not trained to generate again" in x for x in lines), lines
    assert not after or any(f"dropped {len(after)} groups trained after" in x for x in lines), lines
    samples = read_jsonl(out / "samples.jsonl")
    prompts_once(out, state["trained"] + 8)
    assert set(in_flight) <= {s["prompt"] for s in samples if s["step"] > state["step"]}  # started again, trained
    rows = read_jsonl(out / "metrics.jsonl")
    assert all(r["agent/retokenized_tokens"] == 0 and r["agent/errors"] == 0 for r in rows if "agent/calls" in r)
