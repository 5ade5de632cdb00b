"""What every pipeline does around its loop: resume, validate on schedule, checkpoint on
schedule, log a step, and stop cleanly (a checkpoint on Ctrl-C, the trace and sinks closed).
The loops themselves live one per file next to this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from asyncrl.pipelines.setup import RunContext, open_tracker
from asyncrl.pipelines.validation import validate
from asyncrl.telemetry.metrics import group_metrics, timer
from asyncrl.types import Group


def resume(ctx: RunContext) -> tuple[int, dict[str, Any]]:
    """(last finished step, pipeline extras) from the latest checkpoint, or (0, {})."""
    path = latest_checkpoint(ctx) if ctx.cfg.trainer.resume else None
    state: dict[str, Any] = {"step": 0, "extra": {}}
    if path is not None:
        state = load_checkpoint(ctx, path)
        ctx.log(f"resumed from {path} (step {state['step']})")
    ctx.tracker = open_tracker(ctx, state["step"])
    return state["step"], state["extra"]


async def run_validation(ctx: RunContext, step: int) -> dict[str, float]:
    return await validate(ctx.rollout, ctx.reward, ctx.val_rows, ctx.cfg.rollout.val_n, tag=str(step))


def due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


async def after_step(ctx: RunContext, step: int, metrics: dict[str, float],
                     groups: Sequence[Group], extra: dict[str, Any] | None = None) -> None:
    """Data metrics, scheduled validation and checkpoint, then log the step."""
    t = ctx.cfg.trainer
    if groups:
        metrics |= group_metrics(groups, ctx.cfg.data.max_response_length)
    metrics |= ctx.reward.metrics()
    metrics["training/global_step"] = step
    metrics["training/epoch"] = ctx.prompts.epoch
    if due(step, t.test_freq, t.total_training_steps):
        metrics |= await run_validation(ctx, step)
    if due(step, t.save_freq, t.total_training_steps):
        with timer("save_checkpoint", metrics):
            save_checkpoint(ctx, step, extra)
    log_step(ctx, step, metrics)


def log_step(ctx: RunContext, step: int, metrics: dict[str, float]) -> None:
    assert ctx.tracker is not None, "call resume() before logging"
    ctx.tracker.log(metrics, step)


async def validate_before_training(ctx: RunContext, step: int) -> None:
    if step == 0 and ctx.cfg.trainer.val_before_train:
        log_step(ctx, 0, await run_validation(ctx, 0))


def interrupted(ctx: RunContext, step: int, extra: dict[str, Any] | None = None) -> None:
    """Ctrl-C: keep the work done so far."""
    if step > 0:
        path = save_checkpoint(ctx, step, extra)
        ctx.log(f"interrupted: saved {path}; run the same command again to resume")


def close(ctx: RunContext) -> None:
    ctx.trace.export(ctx.output_dir / "trace.json")
    if ctx.tracker is not None:
        ctx.tracker.close()


def wall_clock() -> float:
    return time.perf_counter()
