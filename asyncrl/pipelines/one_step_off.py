"""The one-step-off-policy pipeline (SPEC §2): rollout and training on separate resources,
generation of batch k+1 overlapped with training on batch k.

    time ───────────────────────────────────────────────────────────────────────────▶
    rollout  [gen 1 ███████▌][gen 2 (w0) ██████▌ ][gen 3 (w1) ███████ ][gen 4 (w2) ...
    trainer                  [train 1 █████]      [train 2 █████]       [train 3 ...
    sync                    ▲w0                 ▲w1                  ▲w2
                            └ wait_prev_gen: the part of generation not hidden by training

Loop: wait for batch k → sync weights → launch generation of batch k+1 → train on batch k.
Batch 1 is launched before the loop, so every batch is exactly one update stale. The prompt
stream runs on across epochs. A checkpoint records the prompts of the batch in flight, so a
resumed run generates them again instead of skipping them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.pipelines.common import (
    after_step,
    finish,
    interrupted,
    staleness_metrics,
    start,
    train,
    validate_before_training,
)
from asyncrl.pipelines.setup import RunContext
from asyncrl.telemetry import clock
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group, PromptRow

Batch = tuple[list[Group], float]


async def run(ctx: RunContext) -> int:
    step, pending_task, pending_rows = 0, None, []
    try:
        step, extra = await start(ctx)
        await validate_before_training(ctx, step)
        rows = rows_by_uid(ctx, extra.get("in_flight", [])) or ctx.prompts.next_batch()
        pending_task, pending_rows = launch(ctx, rows, step + 1), rows
        while step < ctx.cfg.trainer.total_training_steps and pending_task is not None:
            step += 1
            pending_task, pending_rows = await train_one_step(ctx, step, pending_task)
    except (KeyboardInterrupt, asyncio.CancelledError):
        await interrupted(ctx, step, {"in_flight": [r.uid for r in pending_rows]})
        raise
    finally:
        if pending_task is not None:
            pending_task.cancel()
        finish(ctx)
    return step


async def train_one_step(ctx: RunContext, step: int, pending: asyncio.Task[Batch]
                         ) -> tuple[asyncio.Task[Batch] | None, list[PromptRow]]:
    """Wait for batch `step`, publish the trainer's weights (unless the rollout side has them
    already: the first step of a run), launch batch `step + 1`, train on batch `step`."""
    metrics: dict[str, float] = {}
    next_task, next_rows = None, []
    with timer("step", metrics):
        with timer("wait_prev_gen", metrics):
            groups, gen_s = await pending
        metrics["timing_s/generate_sequences"] = gen_s
        if ctx.synchronizer.behind:
            with ctx.trace.span("sync", "sync", version=ctx.synchronizer.version + 1):
                metrics |= await ctx.synchronizer.sync()
        if step < ctx.cfg.trainer.total_training_steps:
            next_rows = ctx.prompts.next_batch()
            next_task = launch(ctx, next_rows, step + 1)
        with timer("train", metrics):
            metrics |= await train(ctx, groups, step)
    metrics |= staleness_metrics(groups, ctx.synchronizer.version)
    await after_step(ctx, step, metrics, groups, {"in_flight": [r.uid for r in next_rows]})
    return next_task, next_rows


def launch(ctx: RunContext, rows: list[PromptRow], step: int) -> asyncio.Task[Batch]:
    """Start generating (and scoring) a batch in the background."""
    async def generate() -> Batch:
        start = clock.now()
        n = ctx.cfg.rollout.n
        groups = await asyncio.gather(*(
            ctx.rollout.generate_scored(r, n, f"{r.uid}@{step}") for r in rows))
        return list(groups), clock.now() - start

    return asyncio.create_task(generate())


def rows_by_uid(ctx: RunContext, uids: list[Any]) -> list[PromptRow]:
    by_uid = {r.uid: r for r in ctx.train_rows}
    return [by_uid[u] for u in uids if u in by_uid]
