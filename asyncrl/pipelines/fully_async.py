"""The fully asynchronous streaming pipeline (SPEC §3): Rollouter → MessageQueue → Trainer,
with ParameterSynchronizer, under the freshness budget of `scheduling.staleness`.

    time ───────────────────────────────────────────────────────────────────────────▶
    rollouter ░▓▓░▓▓▓▓▓░▓▓▓░▓▓▓▓▓▓▓▓░▓▓░▓▓▓░▓▓▓▓▓░▓   one group = n responses to one prompt
    queue          ▕▏▕▏▕▏▕▏      ▕▏▕▏▕▏▕▏      ▕▏▕▏       finished groups, oldest first
    trainer          [upd][upd]▲   [upd][upd]▲   [upd]   a local update per R prompts
    sync                      v+1            v+2         every T local updates

Modes: (a) T=1, threshold 0: on-policy streaming; (b) T>1, threshold 0: stream off-policy;
(c) threshold > 0 without partial rollout: at a sync the rollouter stops starting prompts and
the sync waits for in-flight groups; (d) with `partial_rollout`: the sync interrupts in-flight
generation, loads the new weights and the same samples continue from their partial responses.
`max_version_lag` drops (and regenerates) any group older than the cap, so no trained sample
exceeds it. Every prompt is trained exactly once: `samples.jsonl` records each one.
"""

from __future__ import annotations

import asyncio
import json
import math

from asyncrl.pipelines.common import (
    after_step,
    finish,
    interrupted,
    staleness_metrics,
    start,
    train,
    validate_before_training,
)
from asyncrl.pipelines.rollouter import Rollouter
from asyncrl.pipelines.setup import RunContext
from asyncrl.queue.message_queue import MessageQueue
from asyncrl.scheduling.batching import prompts_per_update
from asyncrl.scheduling.staleness import StalenessBudget
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group


class AsyncTrainer:
    """The trainer loop: collect R prompts' groups, update, sync every T updates."""

    def __init__(self, ctx: RunContext, queue: MessageQueue, rollouter: Rollouter,
                 budget: StalenessBudget, total_prompts: int) -> None:
        self.ctx, self.queue, self.rollouter, self.budget = ctx, queue, rollouter, budget
        self.R, self.T = budget.prompts_per_update, budget.updates_per_sync
        self.total_prompts = total_prompts
        self.trained = 0
        self.dropped = 0
        self.ledger = (ctx.output_dir / "samples.jsonl").open("a")

    @property
    def total_updates(self) -> int:
        return math.ceil(self.total_prompts / self.R)

    @property
    def version(self) -> int:
        """The policy version: weight syncs so far (`ParameterSynchronizer.version`)."""
        return self.ctx.synchronizer.version

    async def run(self, step: int) -> int:
        while self.trained < self.total_prompts:
            step += 1
            metrics: dict[str, float] = {}
            with timer("step", metrics):
                groups = await self.collect(metrics)
                if not groups:
                    break
                with timer("train", metrics):
                    metrics |= await train(self.ctx, groups, step)
                self.record(groups)
                metrics |= staleness_metrics(groups, self.version)
                if step % self.T == 0 or self.trained >= self.total_prompts:
                    metrics |= await self.sync()
            metrics |= self.step_metrics(metrics)
            await after_step(self.ctx, step, metrics, groups, self.state(),
                             validate_now=self.validation_due(step))
        await self.rollouter.finish()
        return step

    def state(self) -> dict[str, int]:
        """What a checkpoint needs to continue the count (the policy version is saved with the
        synchronizer's). Groups queued or in flight at the checkpoint are not saved: a resumed
        run starts after them (not lossless yet)."""
        return {"trained": self.trained, "dropped": self.dropped}

    def restore(self, state: dict[str, int]) -> None:
        self.trained = state.get("trained", 0)
        self.dropped = state.get("dropped", 0)

    async def collect(self, metrics: dict[str, float]) -> list[Group]:
        """The next R prompts' groups (fewer at the end), skipping any past the lag cap."""
        want = min(self.R, self.total_prompts - self.trained)
        groups: list[Group] = []
        with timer("wait_samples", metrics), self.ctx.trace.span("wait_samples", "trainer"):
            while len(groups) < want:
                group = await self.queue.get()
                if self.budget.admissible(group.min_version, self.version):
                    groups.append(group)
                else:
                    self.dropped += 1
                    self.rollouter.requeue(group.row)
        return groups

    async def sync(self) -> dict[str, float]:
        """Bump the version: hold new starts, then wait for (c) or interrupt (d) in-flight work."""
        partial = self.ctx.cfg.async_training.partial_rollout
        self.rollouter.hold()
        if not partial:
            await self.rollouter.drain()
        with self.ctx.trace.span("sync", "sync", version=self.version + 1, interrupt=partial):
            metrics = await self.ctx.synchronizer.sync(interrupt=partial)
        self.budget.on_sync(num_stale=len(self.queue) + self.rollouter.in_flight)
        self.rollouter.release()
        return metrics

    def record(self, groups: list[Group]) -> None:
        self.trained += len(groups)
        for g in groups:
            self.ledger.write(json.dumps({
                "uid": g.uid, "prompt": g.row.uid, "trained_at_version": self.version,
                "start_version": g.min_version,
                "end_version": max(t.end_version for t in g.trajectories),
                "segments": max(t.num_segments for t in g.trajectories)}) + "\n")
        self.ledger.flush()

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        step_s = metrics.get("timing_s/step", 0.0) or 1e-9
        return (self.queue.metrics() | self.rollouter.metrics()
                | {"trainer/idle_ratio": metrics.get("timing_s/wait_samples", 0.0) / step_s,
                   "fully_async/count/dropped_stale": self.dropped, "training/param_version": self.version})

    def validation_due(self, step: int) -> bool:
        freq = self.ctx.cfg.rollout.test_freq
        synced_now = step % self.T == 0
        return self.trained >= self.total_prompts or (freq > 0 and synced_now and self.version % freq == 0)


def total_prompts(ctx: RunContext) -> int:
    cfg = ctx.cfg
    return cfg.rollout.total_rollout_steps or cfg.data.train_batch_size * cfg.trainer.total_training_steps


async def run(ctx: RunContext) -> int:
    a, step = ctx.cfg.async_training, 0
    R = prompts_per_update(a.require_batches, ctx.cfg.actor.ppo_mini_batch_size)
    budget = StalenessBudget(R, a.trigger_parameter_sync_step, a.staleness_threshold, a.max_version_lag)
    queue = MessageQueue(capacity=max(2 * budget.per_version, 1))
    rollouter = Rollouter(ctx, queue, budget, total_prompts(ctx))
    trainer = AsyncTrainer(ctx, queue, rollouter, budget, total_prompts(ctx))
    rollout_task: asyncio.Task[None] | None = None
    train_task: asyncio.Task[int] | None = None
    try:
        step, extra = await start(ctx, total_steps=trainer.total_updates)
        trainer.restore(extra)
        rollouter.started = trainer.trained
        await validate_before_training(ctx, step)
        rollout_task = asyncio.create_task(rollouter.run())
        train_task = asyncio.create_task(trainer.run(step))
        done, _ = await asyncio.wait({rollout_task, train_task}, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # a crash in either loop fails the run with its error
        step = await train_task
    except (KeyboardInterrupt, asyncio.CancelledError):
        await interrupted(ctx, step)
        raise
    finally:
        for task in (t for t in (rollout_task, train_task) if t is not None):
            task.cancel()
        trainer.ledger.close()
        finish(ctx)
    return step
