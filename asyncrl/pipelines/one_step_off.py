"""The one-step-off-policy pipeline (SPEC §2): rollout and training on separate resources,
generation of batch k+1 overlapped with training on batch k.

    time ───────────────────────────────────────────────────────────────────────────▶
    rollout  [gen 1 ███████▌][gen 2 (w0) ██████▌ ][gen 3 (w1) ███████ ][gen 4 (w2) ...
    trainer                  [train 1 █████]      [train 2 █████]       [train 3 ...
    sync                    ▲w0                 ▲w1                  ▲w2
                            └ wait_prev_gen: the part of generation not hidden by training

Loop: wait for batch k → sync weights → launch generation of batch k+1 → train on batch k.
Batch 1 is launched before the loop, so every batch is exactly one update stale. The prompt
stream runs on across epochs. The batch in flight at a checkpoint is handed out and not
trained, so the checkpoint lists it and a resumed run generates it again first.
"""

from __future__ import annotations

import asyncio

from asyncrl.pipelines.common import after_step, guarded, staleness_metrics, start, train, validate_before_training
from asyncrl.pipelines.setup import RunContext
from asyncrl.telemetry import clock
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group, PromptRow

Batch = tuple[list[Group], float]


async def run(ctx: RunContext) -> int:
    return await guarded(ctx, _loop(ctx))


async def _loop(ctx: RunContext) -> int:
    step, _ = await start(ctx)
    await validate_before_training(ctx, step)
    pending: asyncio.Task[Batch] | None = launch(ctx, ctx.prompts.next_batch(), step + 1)
    try:
        while step < ctx.cfg.trainer.total_training_steps and pending is not None:
            step += 1
            pending = await train_one_step(ctx, step, pending)
    finally:
        if pending is not None:
            pending.cancel()
    return step


async def train_one_step(ctx: RunContext, step: int, pending: asyncio.Task[Batch]) -> asyncio.Task[Batch] | None:
    """Wait for batch `step`, publish the trainer's weights (unless the rollout side has them
    already: the first step of a run), launch batch `step + 1`, train on batch `step`."""
    metrics: dict[str, float] = {}
    next_task = None
    with timer("step", metrics):
        with timer("wait_prev_gen", metrics):
            groups, gen_s = await ctx.stop.race(pending)
        metrics["timing_s/generate_sequences"] = gen_s
        if ctx.synchronizer.behind:
            with ctx.trace.span("sync", "sync", version=ctx.synchronizer.version + 1):
                metrics |= await ctx.synchronizer.sync()
        if step < ctx.cfg.trainer.total_training_steps:
            next_task = launch(ctx, ctx.prompts.next_batch(), step + 1)
        with timer("train", metrics):
            metrics |= await train(ctx, groups, step)
    metrics |= staleness_metrics(groups, ctx.synchronizer.version)
    await after_step(ctx, step, metrics, groups)
    return next_task


def launch(ctx: RunContext, rows: list[PromptRow], step: int) -> asyncio.Task[Batch]:
    """Start generating (and scoring) a batch in the background."""
    async def generate() -> Batch:
        start = clock.now()
        n = ctx.cfg.rollout.n
        groups = await asyncio.gather(*(
            ctx.rollout.generate_scored(r, n, f"{r.uid}@{step}") for r in rows))
        return list(groups), clock.now() - start

    return asyncio.create_task(generate())

