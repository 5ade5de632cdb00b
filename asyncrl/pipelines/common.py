"""What every pipeline does around its loop: resume, validate on schedule, checkpoint on
schedule, log a step, and stop cleanly (a checkpoint on Ctrl-C, the trace, sinks and workers
closed). The loops themselves live one per file next to this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from asyncrl.pipelines.setup import RunContext, open_tracker
from asyncrl.telemetry.metrics import group_metrics, timer
from asyncrl.types import Group
from asyncrl.workers.validation import summarise


async def start(ctx: RunContext, total_steps: int | None = None) -> tuple[int, dict[str, Any]]:
    """Set up weight sync, resume from the latest checkpoint if any: (last step, extras).
    A resumed run pushes the checkpoint's weights to the rollout side once, at the policy
    version it saved. `total_steps` overrides trainer.total_training_steps where a pipeline
    counts differently."""
    ctx.total_steps = total_steps or ctx.cfg.trainer.total_training_steps
    await ctx.synchronizer.setup()
    path = latest_checkpoint(ctx) if ctx.cfg.trainer.resume else None
    state: dict[str, Any] = {"step": 0, "extra": {}}
    if path is not None:
        state = await load_checkpoint(ctx, path)
        await ctx.synchronizer.push(state.get("version", 0) + int(state.get("behind", False)))
        ctx.log(f"resumed from {path} (step {state['step']}, policy version {ctx.synchronizer.version})")
    ctx.tracker = open_tracker(ctx, state["step"])
    return state["step"], state["extra"]


async def run_validation(ctx: RunContext, step: int) -> dict[str, float]:
    """`rollout.val_n` responses per held-out prompt over every rollout worker, summarised."""
    if not ctx.val_rows:
        return {}
    k, metrics = ctx.cfg.rollout.val_n, dict[str, float]()
    with timer("testing", metrics):
        groups = await asyncio.gather(*(ctx.rollout.generate_scored(r, k, f"{r.uid}@val{step}", "val")
                                        for r in ctx.val_rows))
    return metrics | summarise(list(groups), k)


async def train(ctx: RunContext, groups: Sequence[Group], step: int) -> dict[str, float]:
    """One policy update on these groups; the rollout side is then behind the trainer."""
    with ctx.trace.span("train", "trainer", step=step):
        metrics = await ctx.trainer.train_groups(groups)
    ctx.synchronizer.behind = True
    return metrics


def due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


async def after_step(ctx: RunContext, step: int, metrics: dict[str, float],
                     groups: Sequence[Group], extra: dict[str, Any] | None = None,
                     validate_now: bool | None = None) -> None:
    """Data metrics, scheduled validation and checkpoint, then log the step."""
    t = ctx.cfg.trainer
    if groups:
        metrics |= group_metrics(groups, ctx.cfg.data.max_response_length)
        for g in groups:
            ctx.trace.add_group(g, "rollout")
    metrics |= await ctx.rollout.stats()
    metrics["training/responses"] = sum(len(g.trajectories) for g in groups)
    metrics["training/global_step"] = step
    metrics["training/epoch"] = ctx.prompts.epoch
    if validate_now if validate_now is not None else due(step, t.test_freq, ctx.total_steps):
        metrics |= await run_validation(ctx, step)
    if due(step, t.save_freq, ctx.total_steps):
        with timer("save_checkpoint", metrics):
            await save_checkpoint(ctx, step, extra)
    log_step(ctx, step, metrics)


def log_step(ctx: RunContext, step: int, metrics: dict[str, float]) -> None:
    assert ctx.tracker is not None, "call start() before logging"
    ctx.tracker.log(metrics, step)


async def validate_before_training(ctx: RunContext, step: int) -> None:
    if step == 0 and ctx.cfg.trainer.val_before_train:
        log_step(ctx, 0, await run_validation(ctx, 0))


async def interrupted(ctx: RunContext, step: int, extra: dict[str, Any] | None = None) -> None:
    """Ctrl-C: keep the work done so far."""
    if step > 0:
        path = await save_checkpoint(ctx, step, extra)
        ctx.log(f"interrupted: saved {path}; run the same command again to resume")


def finish(ctx: RunContext) -> None:
    ctx.trace.export(ctx.output_dir / "trace.json")
    if ctx.tracker is not None:
        ctx.tracker.close()
    ctx.close()


def staleness_metrics(groups: Sequence[Group], version: int) -> dict[str, float]:
    """How far behind `version` (the weights being trained) the samples were produced."""
    starts = [t.start_version for g in groups for t in g.trajectories]
    if not starts:
        return {}
    lags = [version - v for v in starts]
    partial = [t.num_segments > 1 for g in groups for t in g.trajectories]
    return {"staleness/version_lag_mean": sum(lags) / len(lags), "staleness/version_lag_max": max(lags),
            "fully_async/count/stale_samples_processed": sum(lag > 0 for lag in lags),
            "fully_async/count/stale_trajectory_processed": sum(
                any(version - t.start_version > 0 for t in g.trajectories) for g in groups),
            "fully_async/partial/total_partial_num": sum(partial),
            "fully_async/partial/partial_ratio": sum(partial) / len(partial),
            "fully_async/partial/max_partial_span": max(
                (t.end_version - t.start_version for g in groups for t in g.trajectories), default=0)}
