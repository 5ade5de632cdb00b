"""The colocated synchronous pipeline: the same resources do every phase, one after another.

    time ─────────────────────────────────────────────────────────────────────────▶
    engines  [gen k ████████▌      ]                               [gen k+1 ███████
    trainer                         [rew][old_lp][ref][adv][update]
    sync                                                            ▌param_sync
             └──────────── step k: the update waits for the longest response ──┘

This is the baseline the decoupled pipelines are measured against (SPEC §1): on-policy,
old log-probs recomputed by the actor. It overlaps nothing, unless a long-tail remedy is on: the
step's batch comes from the run's `BatchSource` (plain generation, DAPO dynamic sampling
(`algorithm.filter_groups`) or tail batching's rounds, then the TP planner), and the stream
trainer (`streaming`) computes gradients of finished groups while the rest still generate.
"""

from __future__ import annotations

from asyncrl.pipelines.batch_source import Batch, BatchSource, batch_source
from asyncrl.pipelines.common import after_step, guarded, start, train, validate_before_training
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.streaming import StreamFeeder
from asyncrl.scheduling.stream_trigger import StreamTrigger
from asyncrl.telemetry.metrics import timer


async def run(ctx: RunContext) -> int:
    """Train until trainer.total_training_steps; returns the last finished step."""
    return await guarded(ctx, _loop(ctx))


async def _loop(ctx: RunContext) -> int:
    source = batch_source(ctx)
    s = ctx.cfg.stream_trainer
    trigger = StreamTrigger(s.min_done, s.max_done, s.check_every) if s.enable else None
    ctx.pipeline_state = source.state
    step, state = await start(ctx)
    source.restore(state)
    await validate_before_training(ctx, step)
    while step < ctx.plan.updates:
        step += 1
        await train_one_step(ctx, step, source, trigger)
    return step


async def train_one_step(ctx: RunContext, step: int, source: BatchSource,
                         trigger: StreamTrigger | None = None) -> None:
    """Generate and score batch `step` (timed `gen`, `reward`), update on it (`adv`,
    `update_actor`, ...: the trainer's), then push the weights to the engines (`param_sync`)."""
    metrics: dict[str, float] = {}
    feeder = StreamFeeder(ctx, trigger) if trigger is not None else None
    with timer("step", metrics):
        batch = await _generate(ctx, step, source, feeder)
        metrics |= batch.metrics | batch.stages
        metrics |= await train(ctx, batch.groups, step, consumed=batch.consumed,
                               update=feeder.finish if feeder is not None else None)
        if batch.groups:
            with ctx.trace.span("sync", "sync", step=step):
                metrics |= await ctx.synchronizer.sync()
    await after_step(ctx, step, metrics, batch.groups)


async def _generate(ctx: RunContext, step: int, source: BatchSource, feeder: StreamFeeder | None) -> Batch:
    """Batch `step`, its groups streamed into the trainer as they finish if the stream trainer is on."""
    try:
        return await ctx.stop.race(source.next(step, feeder.on_group if feeder is not None else None))
    except BaseException:
        if feeder is not None:
            feeder.cancel()
        raise
