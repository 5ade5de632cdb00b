"""What every pipeline does around its loop: resume, train and record an update, validate and
checkpoint on schedule, log a step (with what the model generated: `log_generations`), and stop
cleanly (`guarded`: a checkpoint on a stop signal or a failure outside the trainer, then the
trace, sinks and workers closed). The loops themselves live one per file next to this module.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from asyncrl.pipelines.checkpoint import load_checkpoint, save_checkpoint, snapshot
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.setup import open_tracker
from asyncrl.pipelines.stopping import Stopped
from asyncrl.telemetry.generations import Split, pick, records
from asyncrl.telemetry.metrics import group_metrics, timer
from asyncrl.telemetry.perf import run_devices, step_perf
from asyncrl.telemetry.val_metrics import validation_metrics
from asyncrl.types import Group, PromptRow


async def start(ctx: RunContext) -> tuple[int, dict[str, Any]]:
    """Set up weight sync, resume from `ctx.resume_from` if set: (last step, the pipeline's
    checkpointed state). A resumed run pushes the checkpoint's weights to the rollout side once,
    at the policy version it saved."""
    await ctx.synchronizer.setup()
    state: dict[str, Any] = {"step": 0, "pipeline": {}}
    if ctx.resume_from is not None:
        state = await load_checkpoint(ctx, ctx.resume_from)
        await ctx.synchronizer.push(state["version"] + int(state["behind"]))
        ctx.log(f"resumed from {ctx.resume_from} (step {state['step']}, policy version {ctx.synchronizer.version}, "
                f"{len(ctx.prompts.outstanding)} prompts handed out and not trained to generate again)")
    else:
        ctx.ledger.rollback(0)  # a fresh run in a used directory lists only its own samples
    ctx.tracker = open_tracker(ctx, state["step"])
    return state["step"], state["pipeline"]


async def guarded(ctx: RunContext, loop: Coroutine[Any, Any, int]) -> int:
    """Run a pipeline's loop. On a stop signal, a cancellation or a failure outside the trainer,
    first checkpoint the last finished update (its prompts handed out and not trained are listed
    in it), then re-raise; a failure during an update saves nothing (the weights may be half
    updated). Always closes the run."""
    try:
        return await loop
    except (Stopped, KeyboardInterrupt, asyncio.CancelledError):
        await interrupted(ctx)
        raise
    except Exception:
        if not ctx.training:
            try:
                await interrupted(ctx)
            except Exception as exc:  # noqa: BLE001 - the run's own error is the one to raise
                ctx.log(f"no checkpoint written after the failure: {exc}")
        raise
    finally:
        finish(ctx)


async def run_validation(ctx: RunContext, step: int) -> dict[str, float]:
    """`rollout.val_n` responses per held-out prompt over every rollout worker, with the metrics
    `asyncrl eval` reports (`asyncrl.telemetry.val_metrics`)."""
    if not ctx.val_rows:
        return {}
    k, metrics = ctx.cfg.rollout.val_n, dict[str, float]()
    with timer("testing", metrics), ctx.trace.span("validate", "validation", step=step):
        groups = await asyncio.gather(*(ctx.rollout.generate_scored(r, k, f"{r.uid}@val{step}", "val")
                                        for r in ctx.val_rows))
    for g in groups:
        ctx.trace.add_group(g, "rollout", validation=True)
    log_generations(ctx, "val", step, groups)
    return metrics | validation_metrics(groups)


def log_generations(ctx: RunContext, split: Split, step: int, groups: Sequence[Group]) -> None:
    """`trainer.log_generations` (training) or `log_val_generations` (validation) of these groups'
    responses as text, picked and laid out by `telemetry.generations`, to generations.jsonl and
    the text sinks. Nothing without a tokenizer (the simulator's tokens are not text)."""
    k = ctx.cfg.trainer.log_generations if split == "train" else ctx.cfg.trainer.log_val_generations
    tok = ctx.tokenizer
    if tok is None or k == 0:
        return
    assert ctx.tracker is not None, "call start() before logging"
    picked = pick(groups, k, f"{ctx.cfg.seed}/{split}/{step}")
    text = records(picked, step, split, lambda ids: str(tok.decode(list(ids), skip_special_tokens=True)))
    ctx.tracker.log_generations(split, text, step)


async def train(ctx: RunContext, groups: Sequence[Group], step: int, consumed: Sequence[PromptRow] = (),
                update: Callable[[Sequence[Group]], Awaitable[dict[str, float]]] | None = None) -> dict[str, float]:
    """Update `step` on these groups, recorded as trained (prompt stream, samples.jsonl) along
    with the `consumed` prompts (generated but filtered out); the rollout side is then behind the
    trainer. A cancellation waits for the update to end and
    records it before it propagates, so the weights and the record never disagree. With no
    groups (dynamic sampling kept none) the step is recorded without an update. `update` replaces
    the trainer's `train_groups` (the stream trainer's `StreamFeeder.finish`)."""
    if not groups:
        _record(ctx, groups, step, consumed)
        return {}
    task = asyncio.ensure_future((update or ctx.trainer.train_groups)(groups))
    ctx.training = True  # until recorded: a failed update leaves it set, and nothing is saved
    try:
        with ctx.trace.span("train", "trainer", step=step):
            metrics = await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})  # the update runs on in its worker: let it end
        if not task.cancelled() and task.exception() is None:
            _record(ctx, groups, step, consumed)
        raise
    _record(ctx, groups, step, consumed)
    return metrics


def _record(ctx: RunContext, groups: Sequence[Group], step: int, consumed: Sequence[PromptRow]) -> None:
    ctx.training = False
    ctx.synchronizer.behind |= bool(groups)
    ctx.step = step
    ctx.trained += len(groups)
    ctx.prompts.done([*(g.row for g in groups), *consumed])
    ctx.ledger.record(groups, step, ctx.synchronizer.version)


def group_uids(rows: Sequence[PromptRow], suffix: str) -> list[str]:
    """`{prompt uid}{suffix}` per row, unique in the batch: a prompt drawn twice in one batch (a
    batch across an epoch boundary) gets `~2` on its second group, so request ids never collide.
    Example: rows a, b, a with suffix "@3" -> a@3, b@3, a@3~2."""
    seen: dict[str, int] = {}
    uids = []
    for r in rows:
        seen[r.uid] = seen.get(r.uid, 0) + 1
        uids.append(f"{r.uid}{suffix}" + (f"~{seen[r.uid]}" if seen[r.uid] > 1 else ""))
    return uids


def due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


async def after_step(ctx: RunContext, step: int, metrics: dict[str, float],
                     groups: Sequence[Group], validate_now: bool | None = None) -> None:
    """Data and perf/* metrics, scheduled validation and checkpoint, then log the step; then stop
    if a stop signal came."""
    t = ctx.cfg.trainer
    state = snapshot(ctx)  # now: the rollout side goes on while we validate
    if groups:
        metrics |= group_metrics(groups, ctx.cfg.data.max_response_length)
        for g in groups:
            ctx.trace.add_group(g, "rollout", step=step)
        log_generations(ctx, "train", step, groups)
    metrics |= await ctx.rollout.stats()
    ctx.slow_rewards.observe(ctx.cfg.reward, step, metrics, groups, ctx.log)
    metrics["training/responses"] = sum(len(g.trajectories) for g in groups)
    metrics["training/global_step"] = step
    metrics["training/epoch"] = ctx.prompts.epoch
    metrics |= step_perf(metrics, groups, run_devices(ctx.cfg))
    if validate_now if validate_now is not None else due(step, t.test_freq, ctx.plan.updates):
        metrics |= await run_validation(ctx, step)
    if due(step, t.save_freq, ctx.plan.updates):
        with timer("save_checkpoint", metrics):
            await save_checkpoint(ctx, state)
        if step < ctx.plan.updates:  # a kill keeps the trace so far; after the last step `finish` writes it
            ctx.trace.export(ctx.output_dir / "trace.json", log=ctx.log)
    log_step(ctx, step, metrics)
    ctx.stop.check()


def log_step(ctx: RunContext, step: int, metrics: dict[str, float]) -> None:
    assert ctx.tracker is not None, "call start() before logging"
    ctx.tracker.log(metrics, step)
    check_tool_calls(ctx, step, metrics)


NO_TOOL_STEPS = 3
"""Training steps of a multi-turn run without one tool call before it says so."""


def check_tool_calls(ctx: RunContext, step: int, metrics: dict[str, float]) -> None:
    """A multi-turn run whose model has called no tool by step NO_TOOL_STEPS says so, once: its
    episodes are single turns, and the model is likely one that does not know the tool format."""
    if not ctx.cfg.rollout.multi_turn.enable or "tool_calls/mean" not in metrics or step == 0:
        return
    ctx.tool_calls += metrics["tool_calls/mean"]
    if step == NO_TOOL_STEPS and ctx.tool_calls == 0:
        m = ctx.cfg.rollout.multi_turn
        ctx.log(f"warning: no tool call in {step} steps (tool_calls/mean 0): model.path={ctx.cfg.model.path} does "
                f"not write rollout.multi_turn.format={m.format} calls, so every episode is one turn; "
                f"model.path=tiny-tools is the toy model that calls the built-in tools")


async def validate_before_training(ctx: RunContext, step: int) -> None:
    if step == 0 and ctx.cfg.trainer.val_before_train:
        log_step(ctx, 0, await run_validation(ctx, 0))


async def interrupted(ctx: RunContext) -> None:
    """Keep the work done so far: a checkpoint of the last finished update."""
    if ctx.step == 0:
        return
    path = await save_checkpoint(ctx)
    ctx.log(f"stopped: {path} holds update {ctx.step}; resume with trainer.output_dir={ctx.output_dir} "
            "(trainer.resume_mode=auto)")


def finish(ctx: RunContext) -> None:
    ctx.trace.export(ctx.output_dir / "trace.json", log=ctx.log)
    if ctx.tracker is not None:
        ctx.tracker.close()
    ctx.ledger.close()
    ctx.close()


def staleness_metrics(groups: Sequence[Group], version: int,
                      totals: dict[str, float] | None = None) -> dict[str, float]:
    """How far behind `version` (the weights being trained) the samples were produced, and verl's
    cumulative stale counters, added up in `totals` over the run (verl's
    `FullyAsyncTrainer._collect_metrics_from_samples`): `stale_samples_processed` counts samples
    (a prompt's group; verl's RolloutSample) finished under an older version,
    `stale_trajectory_processed` responses whose last token came from an older version.
    Without `totals` the counters are this batch's. The lag metrics use each response's first
    token (`start_version`)."""
    totals = {} if totals is None else totals
    responses = lag_sum = partial = stale_groups = stale_responses = 0
    lag_max = span_max = -math.inf
    for g in groups:  # one pass, one read of each response's versions (3M responses in a long simulated run)
        newest = -math.inf
        for t in g.trajectories:
            first, last, segments = t.version_span()
            responses += 1
            lag_sum += version - first
            lag_max = max(lag_max, version - first)
            span_max = max(span_max, last - first)
            partial += segments > 1
            stale_responses += version - last >= 1
            newest = max(newest, last)
        stale_groups += bool(g.trajectories) and version - newest >= 1
    if not responses:
        return {}
    stale = {"stale_samples_processed": stale_groups, "stale_trajectory_processed": stale_responses}
    for name, count in stale.items():
        key = f"fully_async/count/{name}"
        totals[key] = totals.get(key, 0) + count
    return {"staleness/version_lag_mean": lag_sum / responses, "staleness/version_lag_max": lag_max,
            **totals, "fully_async/count/current_param_version": version,
            "fully_async/partial/total_partial_num": partial,
            "fully_async/partial/partial_ratio": partial / responses,
            "fully_async/partial/max_partial_span": span_max}
