"""Every pipeline runs multi-turn episodes (the tiny model, a fake tool between two model turns):
colocated, one-step-off and fully async, each prompt trained once, episode metrics logged; a
fully async run stopped mid-generation keeps its partial episodes in the checkpoint and
continues them after resume."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import pytest

from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.stopping import StopControl, Stopped
from asyncrl.types import Group
from tests.agents import fakes
from tests.agents.fakes import AddTools
from tests.pipelines.helpers import make_context, read_jsonl, run_pipeline

pytestmark = pytest.mark.slow

EPISODES = ["rollout.multi_turn.enable=true", "rollout.multi_turn.episode=tests.agents.fakes:PIPELINE_EPISODE",
            "data.max_response_length=40", "trainer.val_before_train=false", "trainer.test_freq=0",
            "rollout.n=4", "actor.ppo_mini_batch_size=4"]
STEPS = ["data.train_batch_size=4", "trainer.total_training_steps=2"]
FULLY_ASYNC = ["pipeline=fully_async", "data.train_batch_size=8", "rollout.total_rollout_steps=24",
               "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true",
               "trainer.save_freq=2"]
SLOW_TOOL = [e.replace("PIPELINE_EPISODE", "SLOW_TOOL_EPISODE") for e in EPISODES]


class StoppingTools(AddTools):
    """At its `at`-th call, requests a stop (as SIGTERM does) while the call runs."""

    def __init__(self, stop: StopControl, at: int) -> None:
        super().__init__(delay_s=0.2)
        self.stop, self.at = stop, at

    async def run(self, call, *, timeout_s: float, max_chars: int):
        if len(self.calls) + 1 == self.at:
            self.stop.request(signal.SIGTERM)
        return await super().run(call, timeout_s=timeout_s, max_chars=max_chars)


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


def test_fully_async_runs_episodes_and_resumes_partial_ones(tiny_cache, tmp_path, monkeypatch):
    overrides = [*SLOW_TOOL, *FULLY_ASYNC]
    ctx = make_context(tmp_path, *overrides)
    # call 52 comes after the first update (a version starts 12 prompts, 48 episodes): a stop then
    # finds that episode (and others) inside a tool call
    monkeypatch.setattr(fakes.SLOW_TOOL_EPISODE, "tools", StoppingTools(ctx.stop, at=52))
    with pytest.raises(Stopped):
        asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    every = {t.request_id: t for g in state["pipeline"].get("parked", []) for t in g.trajectories}
    # a parked group's episodes that finished before the stop are kept as they are (not continued)
    parked = {rid: t for rid, t in every.items() if t.finish_reason == "aborted"}
    kept = {rid: t for rid, t in every.items() if rid not in parked}
    assert parked
    assert all(len(t.loss_mask) == len(t.response_ids) == len(t.versions) for t in parked.values())
    # the abort waited for the tool call and kept its result: turn 1, then the tool message
    waited = [t for t in parked.values() if t.episode.get("tool_calls") == 1]
    assert waited and all(t.loss_mask[-1] == 0 for t in waited)

    tools = AddTools()
    monkeypatch.setattr(fakes.SLOW_TOOL_EPISODE, "tools", tools)
    ctx = make_context(tmp_path, *overrides)
    generated: list[Group] = []
    generate = ctx.rollout.generate_scored

    async def recording(*args, **kwargs):
        group = await generate(*args, **kwargs)
        generated.append(group)
        return group
    ctx.rollout.generate_scored = recording
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    resumed = {t.request_id: t for g in generated for t in g.trajectories if t.request_id in every}
    assert resumed.keys() == every.keys()
    assert all(resumed[rid].response_ids == t.response_ids for rid, t in kept.items())
    for rid, before in parked.items():  # continued on its turn: earlier tokens and versions kept, no tool re-run
        after, n = resumed[rid], len(before.response_ids)
        assert after.response_ids[:n] == before.response_ids and after.versions[:n] == before.versions
        assert after.loss_mask[:n] == before.loss_mask and after.episode["tool_calls"] == 1
        assert after.finish_reason != "aborted" and after.episode["num_turns"] == 2
    # the resumed run called the tool once per episode that had not called it yet (kept ones are done)
    assert len(tools.calls) == sum(len(g.trajectories) for g in generated) - len(waited) - len(kept)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert_episodes_ran(rows)
    assert max(r.get("fully_async/partial/continuations", 0) for r in rows) > 0
    prompts_once(tmp_path, 24)
