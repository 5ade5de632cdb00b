"""The one-step-off-policy pipeline (SPEC §2): rollout and training on separate resources,
generation of batch k+1 overlapped with training on batch k.

    time ───────────────────────────────────────────────────────────────────────────▶
    rollout  [gen 1 ███████▌][gen 2 (w0) ██████▌ ][gen 3 (w1) ███████ ][gen 4 (w2) ...
    trainer                  [train 1 █████]      [train 2 █████]       [train 3 ...
    sync                    ▲w0                 ▲w1                  ▲w2
                            └ wait_prev_gen: the part of generation not hidden by training

Loop: wait for batch k → sync weights → launch generation of batch k+1 → train on batch k.
Batch 1 is launched before the loop, so every batch is exactly one update stale. The prompt
stream runs on across epochs. A scheduled checkpoint waits for the batch in flight and holds
it, so a run resumed from it trains exactly what the uninterrupted run would; a checkpoint taken
on a stop signal mid-generation lists the batch's prompts instead (handed out, not trained),
and the resumed run generates them again first, under the checkpoint's weights.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from asyncrl.pipelines.common import (
    after_step,
    due,
    group_uids,
    guarded,
    staleness_metrics,
    start,
    train,
    validate_before_training,
)
from asyncrl.pipelines.planning import Planner
from asyncrl.pipelines.setup import RunContext
from asyncrl.pipelines.tail_rounds import TailRounds
from asyncrl.telemetry import clock
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group

Batch = tuple[list[Group], float]


async def run(ctx: RunContext) -> int:
    return await guarded(ctx, _loop(ctx))


async def _loop(ctx: RunContext) -> int:
    batch = NextBatch(TailRounds(ctx) if ctx.cfg.tail_batching.enable else None,
                      Planner.from_config(ctx.cfg, ctx.log))
    ctx.pipeline_state = batch.state
    step, state = await start(ctx)
    if batch.rounds is not None:
        batch.rounds.restore(ctx, state)
    await validate_before_training(ctx, step)
    batch.task = restored(ctx, state["batch"]) if state.get("batch") else launch(ctx, batch, step + 1)
    try:
        while step < ctx.cfg.trainer.total_training_steps and batch.task is not None:
            step += 1
            await train_one_step(ctx, step, batch)
    finally:
        if batch.task is not None:
            batch.task.cancel()
    return step


@dataclass
class NextBatch:
    """The batch generated while the trainer trains; a checkpoint holds it once finished."""

    rounds: TailRounds | None = None
    """Tail batching: each batch is a short or a long round, and its long-prompt queue."""
    planner: Planner | None = None
    """The TP planner: the next batch's rollout TP from this one's preemptions."""
    round_metrics: dict[str, float] = field(default_factory=dict)
    """The metrics of the round that made the batch in flight."""
    task: asyncio.Future[Batch] | None = None

    def state(self) -> dict[str, Any]:
        t = self.task
        finished = t is not None and t.done() and not t.cancelled() and t.exception() is None
        held = {"batch": t.result()[0]} if t is not None and finished else {}
        return held | (self.rounds.state() if self.rounds is not None else {})


def restored(ctx: RunContext, groups: list[Group]) -> asyncio.Future[Batch]:
    """A batch a checkpoint held, as if it had just been generated."""
    for g in groups:
        ctx.prompts.claim(g.row)
    future: asyncio.Future[Batch] = asyncio.get_running_loop().create_future()
    future.set_result((groups, 0.0))
    return future


async def train_one_step(ctx: RunContext, step: int, batch: NextBatch) -> None:
    """Wait for batch `step`, publish the trainer's weights (unless the rollout side has them
    already: the first step of a run), launch batch `step + 1`, train on batch `step`."""
    metrics: dict[str, float] = {}
    assert batch.task is not None
    with timer("step", metrics):
        with timer("wait_prev_gen", metrics):
            groups, gen_s = await ctx.stop.race(batch.task)
        batch.task = None
        metrics |= batch.round_metrics
        if batch.planner is not None:  # nothing in flight until the next launch
            await batch.planner.after_step(ctx.rollout, metrics)
        metrics["timing_s/generate_sequences"] = gen_s
        if ctx.synchronizer.behind:
            with ctx.trace.span("sync", "sync", version=ctx.synchronizer.version + 1):
                metrics |= await ctx.synchronizer.sync()
        if step < ctx.cfg.trainer.total_training_steps:
            batch.task = launch(ctx, batch, step + 1)
        with timer("train", metrics):
            metrics |= await train(ctx, groups, step)
        if batch.task is not None and due(step, ctx.cfg.trainer.save_freq, ctx.total_steps):
            with timer("wait_gen_for_checkpoint", metrics):  # the checkpoint holds the batch
                await ctx.stop.race(asyncio.shield(batch.task))
    metrics |= staleness_metrics(groups, ctx.synchronizer.version)
    await after_step(ctx, step, metrics, groups)


def launch(ctx: RunContext, batch: NextBatch, step: int) -> asyncio.Task[Batch]:
    """Start generating (and scoring) batch `step` in the background: the next train_batch_size
    prompts, or with tail batching a short or long round (its metrics join the step's)."""
    async def generate() -> Batch:
        start = clock.now()
        if batch.rounds is not None:
            batch.round_metrics = {}
            groups = await batch.rounds.run(ctx, f"@{step}", True, batch.round_metrics)
        else:
            n, rows = ctx.cfg.rollout.n, ctx.prompts.next_batch()
            groups = list(await asyncio.gather(*(
                ctx.rollout.generate_scored(r, n, uid) for r, uid in zip(rows, group_uids(rows, f"@{step}")))))
        return groups, clock.now() - start

    return asyncio.create_task(generate())
