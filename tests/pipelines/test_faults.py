"""Fault injection in every pipeline: stop (as SIGTERM does) between steps, mid-generation,
mid-update and with a full queue, or crash mid-update (what kill -9 leaves: no checkpoint since
the last scheduled one); then resume and compare the sample ledger with an uninterrupted run.
No prompt may be lost or trained twice; colocated and one-step-off resume to the same metrics.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.errors import WorkerDied
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.stopping import Stopped
from tests.pipelines.helpers import make_context, read_jsonl, run_pipeline

pytestmark = pytest.mark.slow

QUIET = ["trainer.val_before_train=false", "trainer.test_freq=0", "rollout.n=4", "actor.ppo_mini_batch_size=4"]
COLOCATED = [*QUIET, "data.train_batch_size=4", "trainer.total_training_steps=4"]
ONE_STEP_OFF = [*COLOCATED, "pipeline=one_step_off", "trainer.save_freq=2"]
FULLY_ASYNC = [*QUIET, "pipeline=fully_async", "data.train_batch_size=8", "rollout.total_rollout_steps=24",
               "trainer.save_freq=2"]
MODES = {
    "a_on_policy": [],
    "b_stream_off_policy": ["async_training.trigger_parameter_sync_step=2"],
    "c_stale": ["async_training.staleness_threshold=1.0"],
    "d_partial": ["async_training.staleness_threshold=1.0", "async_training.partial_rollout=true"],
}
COMPARED = ("critic/score/mean", "actor/pg_loss", "response_length/mean", "actor/grad_norm")


class Crash(RuntimeError):
    """What kill -9 mid-update leaves behind: no checkpoint of this update."""


class Hooked:
    """A worker (or its Ray proxy) with some methods replaced."""

    def __init__(self, inner, **methods) -> None:
        self._inner = inner
        self.__dict__.update(methods)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def arm(ctx: RunContext, where: str, at: int, *, crash: bool = False, delay_s: float = 0.0) -> None:
    """At the `at`-th event `where` ("generation": a group starts; "update": an update starts;
    "recorded": an update was recorded), request a stop as SIGTERM does, or crash. `delay_s`
    holds the update first (the rollouter fills the queue meanwhile)."""
    count = 0

    def hit() -> bool:
        nonlocal count
        count += 1
        if count == at and crash:
            raise Crash(f"{where} {at}")
        if count == at:
            ctx.stop.request(signal.SIGTERM)
        return count == at

    if where == "generation":
        generate = ctx.rollout.generate_scored

        async def generate_then_hit(*args, **kwargs):
            hit()
            return await generate(*args, **kwargs)
        ctx.rollout.generate_scored = generate_then_hit  # type: ignore[method-assign]
    elif where == "update":
        update = ctx.trainer.train_groups

        async def update_then_hit(groups):
            if count + 1 == at:
                await asyncio.sleep(delay_s)
            hit()
            return await update(groups)
        ctx.trainer = Hooked(ctx.trainer, train_groups=update_then_hit)
    else:
        record = ctx.ledger.record

        def record_then_hit(*args, **kwargs):
            record(*args, **kwargs)
            hit()
        ctx.ledger.record = record_then_hit  # type: ignore[method-assign]


def interrupt(out: Path, overrides: list[str], where: str, at: int, **kw) -> type[BaseException]:
    ctx = make_context(out, *overrides)
    arm(ctx, where, at, **kw)
    with pytest.raises((Stopped, Crash)) as info:
        asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    return info.type


def ledger(out: Path) -> list[tuple[int, str]]:
    return [(s["step"], s["prompt"]) for s in read_jsonl(out / "samples.jsonl")]


def assert_same_metrics(resumed: list[dict], full: list[dict], after: int) -> None:
    by_step = {r["step"]: r for r in full}
    later = [r for r in resumed if r["step"] > after]
    assert [r["step"] for r in later] == [s for s in sorted(by_step) if s > after]
    for row in later:
        for k in COMPARED:
            assert row[k] == pytest.approx(by_step[row["step"]][k], rel=1e-4, abs=1e-6), (row["step"], k)


@pytest.fixture(scope="module")
def uninterrupted(tiny_cache, tmp_path_factory):
    """pipeline -> (metrics, ledger) of a run nothing interrupted."""
    runs = {}
    for name, overrides in (("colocated", COLOCATED), ("one_step_off", ONE_STEP_OFF)):
        out = tmp_path_factory.mktemp(name)
        runs[name] = run_pipeline(out, *overrides), ledger(out)
    return runs


@pytest.mark.parametrize(("where", "at", "saved"), [("recorded", 2, 2), ("generation", 10, 2), ("update", 3, 3)])
def test_colocated_stopped_anywhere_resumes_exactly(uninterrupted, tmp_path, where, at, saved):
    assert interrupt(tmp_path, COLOCATED, where, at) is Stopped
    assert load_checkpoint_state(latest_checkpoint(tmp_path))["step"] == saved
    resumed = run_pipeline(tmp_path, *COLOCATED)
    full_metrics, full_ledger = uninterrupted["colocated"]
    assert ledger(tmp_path) == full_ledger
    assert_same_metrics(resumed, full_metrics, after=saved)


def test_colocated_crash_mid_update_resumes_from_the_last_checkpoint(uninterrupted, tmp_path):
    overrides = [*COLOCATED, "trainer.save_freq=2"]
    interrupt(tmp_path, overrides, "update", 4, crash=True)
    assert [p.name for p in (tmp_path / "checkpoints").glob("global_step_*")] == ["global_step_2"]
    assert len(ledger(tmp_path)) == 3 * 4  # three updates were recorded before the crash
    resumed = run_pipeline(tmp_path, *overrides)
    full_metrics, full_ledger = uninterrupted["colocated"]
    assert ledger(tmp_path) == full_ledger  # steps 3 and 4 once each: the ledger rolled back
    assert_same_metrics(resumed, full_metrics, after=2)


def test_one_step_off_crash_resumes_exactly_from_a_scheduled_checkpoint(uninterrupted, tmp_path):
    interrupt(tmp_path, ONE_STEP_OFF, "update", 4, crash=True)
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    assert state["step"] == 2 and len(state["pipeline"]["batch"]) == 4  # batch 3, generated under w1
    resumed = run_pipeline(tmp_path, *ONE_STEP_OFF)
    full_metrics, full_ledger = uninterrupted["one_step_off"]
    assert ledger(tmp_path) == full_ledger
    assert_same_metrics(resumed, full_metrics, after=2)


def test_one_step_off_stopped_mid_generation_loses_and_doubles_nothing(uninterrupted, tmp_path):
    assert interrupt(tmp_path, ONE_STEP_OFF, "generation", 10) is Stopped
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    assert state["step"] == 2 and len(state["prompts"]["outstanding"]) == 4  # batch 3: held or listed
    run_pipeline(tmp_path, *ONE_STEP_OFF)
    assert ledger(tmp_path) == uninterrupted["one_step_off"][1]


def test_one_step_off_with_dynamic_sampling_resumes_exactly_with_the_prompts_its_held_batch_consumed(
        tiny_cache, tmp_path):
    """The checkpoint holds batch 3 and the prompts of the groups dynamic sampling dropped for it:
    recorded as consumed when batch 3 trains, never generated again."""
    overrides = [*ONE_STEP_OFF, "algorithm.filter_groups.enable=true"]
    full_metrics = run_pipeline(tmp_path / "full", *overrides)
    interrupt(tmp_path / "crashed", overrides, "update", 4, crash=True)
    state = load_checkpoint_state(latest_checkpoint(tmp_path / "crashed"))
    held = [g.row.uid for g in state["pipeline"]["batch"]] + [r.uid for r in state["pipeline"]["batch_consumed"]]
    assert state["step"] == 2 and len(state["pipeline"]["batch_consumed"]) > 0
    assert sorted(state["prompts"]["outstanding"]) == sorted(held)
    resumed = run_pipeline(tmp_path / "crashed", *overrides)
    assert ledger(tmp_path / "crashed") == ledger(tmp_path / "full")
    assert_same_metrics(resumed, full_metrics, after=2)
    step3 = [r for r in resumed if r["step"] == 3][0]
    assert step3["train/num_gen_batches"] == [r for r in full_metrics if r["step"] == 3][0]["train/num_gen_batches"]


def assert_each_prompt_once(out: Path, total: int) -> None:
    prompts = Counter(p for _, p in ledger(out))
    assert sum(prompts.values()) == total and max(prompts.values()) == 1, prompts.most_common(3)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fully_async_stopped_with_a_full_queue_trains_each_prompt_once(tiny_cache, tmp_path, mode):
    overrides = [*FULLY_ASYNC, *MODES[mode]]
    assert interrupt(tmp_path, overrides, "update", 3, delay_s=1.5) is Stopped
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    assert state["step"] == 3 and state["trained"] == 12
    if mode in ("c_stale", "d_partial"):  # the budget let the rollouter fill the queue meanwhile
        assert len(state["pipeline"]["queue"]) >= 4
    run_pipeline(tmp_path, *overrides)
    assert_each_prompt_once(tmp_path, 24)


@pytest.mark.parametrize(("where", "at", "crash"),
                         [("generation", 14, False), ("generation", 20, True), ("update", 5, True)])
def test_fully_async_stopped_mid_generation_or_crashed_trains_each_prompt_once(tiny_cache, tmp_path, where, at,
                                                                               crash):
    overrides = [*FULLY_ASYNC, *MODES["d_partial"], "data.max_response_length=48", "rollout.ignore_eos=true"]
    # the budget starts at most 8 prompts per policy version: launch 14 (20) comes after update 1 (2)
    interrupt(tmp_path, overrides, where, at, crash=crash)
    state = load_checkpoint_state(latest_checkpoint(tmp_path))
    parked = state["pipeline"].get("parked", [])
    if where == "generation" and not crash:  # a stop with partial rollout keeps the partial responses
        assert parked and any(t.finish_reason == "aborted" for g in parked for t in g.trajectories)
    rows = run_pipeline(tmp_path, *overrides)
    assert_each_prompt_once(tmp_path, 24)
    if parked:
        assert max(r.get("fully_async/partial/continuations", 0) for r in rows) > 0


def test_fully_async_on_ray_stopped_with_a_full_queue_trains_each_prompt_once(tiny_cache, ray_cluster, tmp_path):
    overrides = [*FULLY_ASYNC, *MODES["c_stale"], "backend=ray"]
    assert interrupt(tmp_path, overrides, "update", 3, delay_s=1.5) is Stopped
    assert load_checkpoint_state(latest_checkpoint(tmp_path))["pipeline"]["queue"]
    run_pipeline(tmp_path, *overrides)
    assert_each_prompt_once(tmp_path, 24)


def kill_worker_at(ctx: RunContext, where: str, at: int, worker) -> None:
    """kill -9 the process of `worker` (a Ray proxy) at the `at`-th event `where`."""
    count = 0

    async def kill_then(call, *args, **kwargs):
        nonlocal count
        count += 1
        if count == at:
            os.kill(await worker._caller.pid(), signal.SIGKILL)
        return await call(*args, **kwargs)

    if where == "generation":
        generate = ctx.rollout.generate_scored
        ctx.rollout.generate_scored = functools.partial(kill_then, generate)  # type: ignore[method-assign]
    else:
        ctx.trainer = Hooked(ctx.trainer, train_groups=functools.partial(kill_then, ctx.trainer.train_groups))


@pytest.mark.parametrize(("role", "where", "at"), [("rollout worker 0", "generation", 14), ("trainer", "update", 4)])
def test_a_killed_ray_worker_is_named_and_loses_no_prompt(tiny_cache, ray_cluster, tmp_path, role, where, at):
    overrides = [*FULLY_ASYNC, *MODES["c_stale"], "backend=ray"]
    ctx = make_context(tmp_path, *overrides)
    worker = ctx.rollout.workers[0] if role.startswith("rollout") else ctx.trainer
    kill_worker_at(ctx, where, at, worker)
    with pytest.raises(WorkerDied, match=f"^{role} died"):
        asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    saved = load_checkpoint_state(latest_checkpoint(tmp_path))["step"]
    assert saved == (2 if role == "trainer" else ctx.step)  # a dead trainer saves nothing: save_freq=2 did
    run_pipeline(tmp_path, *overrides)
    assert_each_prompt_once(tmp_path, 24)


def test_a_killed_rollout_worker_restarts_and_the_run_goes_on(tiny_cache, ray_cluster, tmp_path):
    overrides = [*FULLY_ASYNC, *MODES["c_stale"], "backend=ray", "rollout.num_engines=2", "rollout.max_restarts=1"]
    ctx = make_context(tmp_path, *overrides)
    kill_worker_at(ctx, "generation", 10, ctx.rollout.workers[0])
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    assert_each_prompt_once(tmp_path, 24)
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert last["rollout/worker_restarts"] == 1 and last["training/global_step"] == 6
