"""The one-step-off-policy pipeline (SPEC §2): rollout and training on separate resources,
generation of batch k+1 overlapped with training on batch k.

    time ───────────────────────────────────────────────────────────────────────────▶
    rollout  [gen 1 ███████▌][gen 2 (w0) ██████▌ ][gen 3 (w1) ███████ ][gen 4 (w2) ...
    trainer                  [train 1 █████]      [train 2 █████]       [train 3 ...
    sync                    ▲w0                 ▲w1                  ▲w2
                            └ wait_prev_gen: the part of generation not hidden by training

Loop: wait for batch k → sync weights → launch generation of batch k+1 → train on batch k.
Batch 1 is launched before the loop, so every batch is exactly one update stale. The batches
come from the run's `BatchSource` (`prefetch` makes the next one in the background): plain
generation, DAPO dynamic sampling (`algorithm.filter_groups`: its refill rounds run in the
background too) or tail batching's rounds, each group scored on the rollout side as it
finishes. The prompt stream runs on across epochs. A scheduled checkpoint waits for the batch
in flight and holds it, so a run resumed from it trains exactly what the uninterrupted run
would; a checkpoint taken on a stop signal mid-generation lists the batch's prompts instead
(handed out, not trained), and the resumed run generates them again first, under the
checkpoint's weights.
"""

from __future__ import annotations

from asyncrl.pipelines.batch_source import BatchSource, batch_source
from asyncrl.pipelines.common import after_step, due, guarded, staleness_metrics, start, train, validate_before_training
from asyncrl.pipelines.context import RunContext
from asyncrl.telemetry.metrics import timer


async def run(ctx: RunContext) -> int:
    return await guarded(ctx, _loop(ctx))


async def _loop(ctx: RunContext) -> int:
    source = batch_source(ctx)
    ctx.pipeline_state = source.state
    step, state = await start(ctx)
    source.restore(state)
    await validate_before_training(ctx, step)
    total = ctx.plan.updates
    try:
        if step < total:
            source.prefetch(step + 1)  # unless the checkpoint held it
        while step < total:
            step += 1
            await train_one_step(ctx, step, source)
    finally:
        source.cancel()
    return step


async def train_one_step(ctx: RunContext, step: int, source: BatchSource) -> None:
    """Wait for batch `step`, publish the trainer's weights (unless the rollout side has them
    already: the first step of a run), launch batch `step + 1`, train on batch `step`."""
    metrics: dict[str, float] = {}
    total = ctx.plan.updates
    with timer("step", metrics):
        with timer("wait_prev_gen", metrics):
            batch = await ctx.stop.race(source.next(step))
        metrics |= batch.metrics
        metrics["timing_s/generate_sequences"] = batch.seconds
        if ctx.synchronizer.behind:
            with ctx.trace.span("sync", "sync", version=ctx.synchronizer.version + 1):
                metrics |= await ctx.synchronizer.sync()
        if step < total:
            source.prefetch(step + 1)
        with timer("train", metrics):
            metrics |= await train(ctx, batch.groups, step, consumed=batch.consumed)
        if step < total and due(step, ctx.cfg.trainer.save_freq, total):
            with timer("wait_gen_for_checkpoint", metrics):  # the checkpoint holds the batch
                await ctx.stop.race(source.settle())
    metrics |= staleness_metrics(batch.groups, ctx.synchronizer.version)
    await after_step(ctx, step, metrics, batch.groups)
