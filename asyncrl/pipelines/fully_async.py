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
`max_concurrent_samples`). `max_version_lag` bounds every trained sample's lag: by default
(`version_lag_policy=pace`) the trainer waits for a group, queued or in flight, before the next
sync would put it past the cap and trains it in this update (so a slow group is never thrown away
for being slow); with `drop`, a group past the cap is dropped and its prompt generated again (the
dropped lengths are reported: dropping favours fast, short responses). DAPO dynamic sampling
(`algorithm.filter_groups`): a group whose rewards all agree is dropped and counted, its prompt
consumed (it counted against the freshness budget when it started and is not generated again); the
trainer waits for R kept groups, or trains on fewer when nothing more can come before its next sync
(the budget spent, nothing in flight) or the run's prompts are used up. Metrics: one metrics.jsonl
line per local update (`training/global_step`); verl's step is a sync cycle of T updates
(`fully_async/count/current_param_version`, which the summaries count), and its stale counters are
cumulative. Every prompt is trained exactly once: `samples.jsonl` records each one. A checkpoint
holds the queue's finished groups (with their tokens, behaviour log-probs and versions) and the
staleness counters; prompts in flight are listed by the prompt stream and generated again on
resume, so a resumed run trains exactly the prompts not yet trained.
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
        self.dropped_tokens = self.dropped_responses = 0
        """The responses of the dropped groups and their tokens (`version_lag_policy=drop`): what dropping removes."""
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
                groups, filtered = await self.collect(metrics, sync_after=step % self.T == 0)
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
        return {"dropped": self.dropped, "dropped_tokens": self.dropped_tokens,
                "dropped_responses": self.dropped_responses, "filtered": self.filtered,
                "started": r.started, "launches": r.launches,
                "in_flight": r.in_flight, "budget_started": self.budget.started, "num_stale": self.budget.num_stale,
                "queue": self.queue.items, "parked": r.parked, "stale_counts": self.stale_counts}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state()`: queued groups go back into the queue (not generated again),
        parked ones (a stop's partial responses) are continued first; the other prompts in
        flight then are started again. Restarted groups count against the budget anew."""
        if not state:
            return
        self.dropped, self.filtered = state["dropped"], state.get("filtered", 0)
        self.dropped_tokens, self.dropped_responses = state.get("dropped_tokens", 0), state.get("dropped_responses", 0)
        self.rollouter.started, self.rollouter.launches = state["started"], state["launches"]
        self.budget.started = max(state["budget_started"] - state["in_flight"], 0)  # those start again
        self.budget.num_stale = state["num_stale"]
        self.stale_counts = dict(state.get("stale_counts", {}))
        for group in state["queue"] + state["parked"]:
            self.ctx.prompts.claim(group.row)
        self.queue.restore(state["queue"])
        self.rollouter.continue_parked(state["parked"])

    async def collect(self, metrics: dict[str, float], sync_after: bool) -> tuple[list[Group], list[PromptRow]]:
        """The next R prompts' groups (fewer at the end), first any that the sync after this
        update (`sync_after`) would put past the lag cap (pacing: waited for, possibly more than R),
        skipping any already past it (dropped); with dynamic sampling, also the prompts of the
        groups it dropped (consumed, not trained)."""
        groups: list[Group] = []
        filtered: list[PromptRow] = []
        with timer("wait_samples", metrics), self.ctx.trace.span("wait_samples", "trainer"):
            if sync_after and (limit := self.due_by()) is not None:
                await self.take_due(limit, groups, filtered)
            while len(groups) < min(self.R, self.total_prompts - self.consumed - len(filtered)):
                if self.filtering and not len(self.queue) and self.rollouter.starved():
                    break  # nothing more comes before the next sync: train on the kept ones
                self.accept(await self.next_group(groups), groups, filtered)
        if self.filtering:
            metrics["train/filtered_groups"] = len(filtered)
        return groups, filtered

    def due_by(self) -> int | None:
        """With `version_lag_policy=pace`: groups started under this version or earlier would pass
        `max_version_lag` after the next sync, so they train before it (None: no cap, or dropping)."""
        a = self.ctx.cfg.async_training
        return self.version - a.max_version_lag if a.max_version_lag >= 0 and a.version_lag_policy == "pace" else None

    async def take_due(self, limit: int, groups: list[Group], filtered: list[PromptRow]) -> None:
        """Wait for every group started by `limit`, queued or in flight, and accept it; the younger
        groups taken meanwhile go back to the front of the queue in their order."""
        younger: list[Group] = []
        while self.rollouter.started_by(limit) or any(g.min_version <= limit for g in self.queue.items):
            group = await self.next_group(groups + younger)
            if group.min_version <= limit:
                self.accept(group, groups, filtered)
            else:
                younger.append(group)
        self.queue.put_back(younger)

    async def next_group(self, taken: list[Group]) -> Group:
        """The oldest finished group; at a stop, `taken` goes back to the queue (the checkpoint keeps it)."""
        try:
            # a queued group is taken at once: racing the stop signal costs two tasks
            return await (self.queue.get() if len(self.queue) else self.ctx.stop.race(self.queue.get()))
        except Stopped:
            self.queue.put_back(taken)
            raise

    def accept(self, group: Group, groups: list[Group], filtered: list[PromptRow]) -> None:
        """Train `group`, or drop it past the lag cap (its prompt generated again, its lengths
        counted), or filter it (dynamic sampling)."""
        if not self.budget.admissible(group.min_version, self.version):
            self.dropped += 1
            self.dropped_responses += len(group.trajectories)
            self.dropped_tokens += sum(len(t.response_ids) for t in group.trajectories)
            self.rollouter.requeue(group.row)
        elif self.filtering and len(set(group.rewards_G)) <= 1:
            filtered.append(group.row)
        else:
            groups.append(group)

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
                   "fully_async/dropped/response_length_mean": self.dropped_tokens / max(self.dropped_responses, 1),
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
