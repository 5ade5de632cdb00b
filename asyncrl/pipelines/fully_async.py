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
(d) with threshold 0 is accepted (verl's ablation runs it): the budget then lets start only
the groups the T updates take, so a sync normally finds nothing to interrupt. At most
`max_concurrent_samples_per_server` x engines prompts generate at once (verl's
`max_concurrent_samples`). `max_version_lag` drops (and regenerates) any group older than the
cap, so no trained sample exceeds it. DAPO dynamic sampling (`algorithm.filter_groups`): a group
whose rewards all agree is dropped and counted, its prompt consumed (it counted against the
freshness budget when it started and is not generated again); the trainer waits for R kept groups,
or trains on fewer when nothing more can come before its next sync (the budget spent, nothing in
flight) or the run's prompts are used up. Metrics: one metrics.jsonl line per local
update (`training/global_step`); verl's step is a sync cycle of T updates
(`fully_async/count/current_param_version`, which the summaries count), and its stale counters
are cumulative. Every prompt is trained exactly once: `samples.jsonl` records each one. A
checkpoint holds the queue's finished groups (with their tokens, behaviour log-probs and
versions) and the staleness counters; prompts in flight are listed by the prompt stream and
generated again on resume, so a resumed run trains exactly the prompts not yet trained.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.pipelines.common import after_step, guarded, staleness_metrics, start, train, validate_before_training
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.rollouter import Rollouter
from asyncrl.pipelines.stopping import Stopped
from asyncrl.queue.message_queue import MessageQueue
from asyncrl.scheduling.staleness import StalenessBudget
from asyncrl.telemetry.metrics import timer
from asyncrl.types import Group, PromptRow


class AsyncTrainer:
    """The trainer loop: collect R prompts' groups, update, sync every T updates."""

    def __init__(self, ctx: RunContext, queue: MessageQueue, rollouter: Rollouter, budget: StalenessBudget) -> None:
        self.ctx, self.queue, self.rollouter, self.budget = ctx, queue, rollouter, budget
        self.R, self.T = ctx.plan.prompts_per_update, ctx.plan.updates_per_sync
        self.total_prompts = ctx.plan.total_prompts
        self.filtering = ctx.cfg.algorithm.filter_groups.enable
        self.filtered = 0
        """Prompts dynamic sampling dropped, recorded as consumed with an update."""
        self.dropped = 0
        self.stale_counts: dict[str, float] = {}
        """verl's cumulative `fully_async/count/stale_*_processed` counters (`staleness_metrics`)."""

    @property
    def trained(self) -> int:
        """Prompts trained in the run: counted with their update (`pipelines.common.train`)."""
        return self.ctx.trained

    @property
    def consumed(self) -> int:
        """Prompts the run is done with: trained, or dropped by dynamic sampling."""
        return self.trained + self.filtered

    @property
    def version(self) -> int:
        """The policy version: weight syncs so far (`ParameterSynchronizer.version`)."""
        return self.ctx.synchronizer.version

    async def run(self, step: int) -> int:
        while self.consumed < self.total_prompts:
            step += 1
            metrics: dict[str, float] = {}
            with timer("step", metrics):
                groups, filtered = await self.collect(metrics)
                if not groups and not filtered:
                    break
                with timer("train", metrics):
                    metrics |= await train(self.ctx, groups, step, consumed=filtered)
                self.filtered += len(filtered)
                metrics |= staleness_metrics(groups, self.version, self.stale_counts)
                if step % self.T == 0 or self.consumed >= self.total_prompts:
                    metrics |= await self.sync()
            metrics |= self.step_metrics(metrics)
            await after_step(self.ctx, step, metrics, groups, validate_now=self.validation_due(step))
        await self.rollouter.finish()
        return step

    def state(self) -> dict[str, Any]:
        """The pipeline's part of a checkpoint (the policy version is the synchronizer's, the
        prompts in flight are the prompt stream's): counts, the staleness budget, the queue."""
        r = self.rollouter
        return {"dropped": self.dropped, "filtered": self.filtered, "started": r.started, "launches": r.launches,
                "in_flight": r.in_flight, "budget_started": self.budget.started, "num_stale": self.budget.num_stale,
                "queue": self.queue.items, "parked": r.parked, "stale_counts": self.stale_counts}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state()`: queued groups go back into the queue (not generated again),
        parked ones (a stop's partial responses) are continued first; the other prompts in
        flight then are started again. Restarted groups count against the budget anew."""
        if not state:
            return
        self.dropped, self.filtered = state["dropped"], state.get("filtered", 0)
        self.rollouter.started, self.rollouter.launches = state["started"], state["launches"]
        self.budget.started = max(state["budget_started"] - state["in_flight"], 0)  # those start again
        self.budget.num_stale = state["num_stale"]
        self.stale_counts = dict(state.get("stale_counts", {}))
        for group in state["queue"] + state["parked"]:
            self.ctx.prompts.claim(group.row)
        self.queue.restore(state["queue"])
        self.rollouter.continue_parked(state["parked"])

    async def collect(self, metrics: dict[str, float]) -> tuple[list[Group], list[PromptRow]]:
        """The next R prompts' groups (fewer at the end), skipping any past the lag cap; with
        dynamic sampling, also the prompts of the groups it dropped (consumed, not trained)."""
        groups: list[Group] = []
        filtered: list[PromptRow] = []
        with timer("wait_samples", metrics), self.ctx.trace.span("wait_samples", "trainer"):
            while len(groups) < min(self.R, self.total_prompts - self.consumed - len(filtered)):
                if self.filtering and not len(self.queue) and self.rollouter.starved():
                    break  # nothing more comes before the next sync: train on the kept ones
                try:
                    # a queued group is taken at once: racing the stop signal costs two tasks
                    group = await (self.queue.get() if len(self.queue) else self.ctx.stop.race(self.queue.get()))
                except Stopped:
                    self.queue.put_back(groups)  # not trained: the checkpoint keeps them queued
                    raise
                if not self.budget.admissible(group.min_version, self.version):
                    self.dropped += 1
                    self.rollouter.requeue(group.row)
                elif self.filtering and len(set(group.rewards_G)) <= 1:
                    filtered.append(group.row)
                else:
                    groups.append(group)
        if self.filtering:
            metrics["train/filtered_groups"] = len(filtered)
        return groups, filtered

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

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        step_s = metrics.get("timing_s/step", 0.0) or 1e-9
        return (self.queue.metrics() | self.rollouter.metrics()
                | {"trainer/idle_ratio": metrics.get("timing_s/wait_samples", 0.0) / step_s,
                   "fully_async/count/dropped_stale": self.dropped, "fully_async/count/filtered_groups": self.filtered,
                   "training/param_version": self.version})

    def validation_due(self, step: int) -> bool:
        freq = self.ctx.cfg.rollout.test_freq
        synced_now = step % self.T == 0
        return self.consumed >= self.total_prompts or (freq > 0 and synced_now and self.version % freq == 0)


def in_flight_cap(ctx: RunContext) -> int:
    """verl's `max_concurrent_samples`: prompts in flight per rollout engine x engines (0 = none)."""
    return ctx.cfg.async_training.max_concurrent_samples_per_server * len(ctx.rollout.workers)


async def run(ctx: RunContext) -> int:
    return await guarded(ctx, _loop(ctx))


async def _loop(ctx: RunContext) -> int:
    a, plan = ctx.cfg.async_training, ctx.plan
    budget = StalenessBudget(plan.prompts_per_update, plan.updates_per_sync, a.staleness_threshold, a.max_version_lag)
    queue = MessageQueue(capacity=max(2 * plan.prompts_per_version, 1))
    rollouter = Rollouter(ctx, queue, budget, plan.total_prompts, in_flight_cap(ctx))
    trainer = AsyncTrainer(ctx, queue, rollouter, budget)
    ctx.pipeline_state = trainer.state
    step, state = await start(ctx)
    trainer.restore(state)
    await validate_before_training(ctx, step)
    rollout_task = asyncio.create_task(rollouter.run())
    train_task = asyncio.create_task(trainer.run(step))
    try:
        done, _ = await asyncio.wait({rollout_task, train_task}, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # a crash in either loop fails the run with its error
        return await train_task
    except Stopped:
        if a.partial_rollout:  # the checkpoint keeps the partial responses (else they start over)
            await rollouter.park()
        raise
    finally:
        rollout_task.cancel()
        rollouter.cancel()
        train_task.cancel()  # an update in flight ends and is recorded first (common.train)
        await asyncio.gather(rollout_task, train_task, return_exceptions=True)
