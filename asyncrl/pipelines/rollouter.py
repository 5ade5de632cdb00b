"""The Rollouter of the fully async pipeline: owns the prompt stream, starts one group per
prompt as the staleness budget and the in-flight cap allow, and puts finished groups into the
queue.

The in-flight cap is verl's `max_concurrent_samples` (recipe/fully_async_policy/
fully_async_rollouter.py, `set_max_required_samples`): at most
`async_training.max_concurrent_samples_per_server` (verl: 16) prompts per rollout engine are
generating at once, whatever the staleness budget would allow. It keeps a version's prompts
arriving over the version instead of all at its start, which is what gives partial rollout
something to interrupt.

It runs in the driver's event loop; generation itself happens on the rollout hosts. It is
idle (`rollouter/idle_ratio`) when no group is in flight: held for a sync, out of budget, or
out of prompts. Prompts handed back to the stream (a group past the lag cap, or prompts that
were in flight at the checkpoint a run resumed from) are started first, without counting
against `total_prompts`, so the stream ends only when the trainer says every prompt is trained.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from asyncrl.pipelines.context import RunContext
from asyncrl.queue.message_queue import MessageQueue
from asyncrl.scheduling.staleness import StalenessBudget
from asyncrl.telemetry import clock
from asyncrl.types import Group, PromptRow, Trajectory


class Rollouter:
    def __init__(self, ctx: RunContext, queue: MessageQueue, budget: StalenessBudget,
                 total_prompts: int, max_in_flight: int = 0) -> None:
        self.ctx, self.queue, self.budget = ctx, queue, budget
        self.total_prompts = total_prompts
        self.max_in_flight = max_in_flight
        """Cap on groups in flight (verl's `max_concurrent_samples`); 0 = no cap."""
        self.peak_in_flight = 0
        self.started = 0
        """Prompts drawn from the stream (not counting those handed back and started again)."""
        self.in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()
        self._held = False
        self._idle_s = 0.0
        self._idle_since: float | None = clock.now()
        self._start_time = clock.now()
        self.launches = 0
        """Groups started in the run (they name the groups' uids, and continue over a resume)."""
        self._error: BaseException | None = None
        self._finished = False
        self._running: dict[str, PromptRow] = {}
        """Groups in flight by uid."""
        self._started_at: dict[str, int] = {}
        """The policy version each group in flight started under (a continued group: its oldest)."""
        self._parking = False
        self.parked: list[Group] = []
        """At a stop, the groups in flight as they were, aborted (for the checkpoint)."""
        self._to_continue: list[Group] = []
        """Parked groups of the stopped run this one resumed: started first, continued."""

    async def run(self) -> None:
        """Start prompts as the budget allows until the trainer has trained them all."""
        self._start_time = self._idle_since = clock.now()
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: self._may_start() or self._error is not None or self._finished)
            self._raise_if_failed()
            if self._finished:
                return
            if self._to_continue:
                group = self._to_continue.pop(0)
                self._launch(group.row, group.uid, group.trajectories)
            else:
                self._launch(self._next_row())

    async def finish(self) -> None:
        """Called by the trainer once every prompt is trained."""
        async with self._changed:
            self._finished = True
            self._changed.notify_all()

    def _may_start(self) -> bool:
        has_prompt = self.started < self.total_prompts or self.ctx.prompts.has_replay or bool(self._to_continue)
        below_cap = self.max_in_flight <= 0 or self.in_flight < self.max_in_flight
        return has_prompt and below_cap and not self._held and self.budget.can_start()

    def started_by(self, version: int) -> int:
        """Groups in flight that started under `version` or earlier."""
        return sum(v <= version for v in self._started_at.values())

    def starved(self) -> bool:
        """Nothing more arrives before the trainer's next sync: none in flight, none may start."""
        return self.in_flight == 0 and not self._may_start()

    def _next_row(self) -> PromptRow:
        if not self.ctx.prompts.has_replay:
            self.started += 1
        return self.ctx.prompts.next_prompt()

    def _launch(self, row: PromptRow, uid: str | None = None, partials: Sequence[Trajectory] = ()) -> None:
        self.budget.on_start()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._mark_busy()
        self.launches += 1
        uid = uid or f"{row.uid}@a{self.launches}"
        self._running[uid] = row
        self._started_at[uid] = min((t.start_version for t in partials if len(t.versions)),
                                    default=self.ctx.synchronizer.version)
        task = asyncio.create_task(self._one(row, uid, partials))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, row: PromptRow, uid: str, partials: Sequence[Trajectory]) -> None:
        queued = False
        try:
            group = await self.ctx.rollout.generate_scored(row, self.ctx.cfg.rollout.n, uid, partials=partials)
            if self._parking:
                self.parked.append(group)
            else:
                await self.queue.put(group)
                queued = True
        except BaseException as exc:  # noqa: BLE001 - re-raised by run()/drain()
            self._error = exc
        finally:
            async with self._changed:
                if not queued:  # its prompt stays outstanding and is started again (after a resume)
                    self.budget.on_abandoned()
                self.in_flight -= 1
                self._running.pop(uid, None)
                self._started_at.pop(uid, None)
                if self.in_flight == 0:
                    self._idle_since = clock.now()
                self._changed.notify_all()

    def _mark_busy(self) -> None:
        if self._idle_since is not None:
            self._idle_s += clock.now() - self._idle_since
            self._idle_since = None

    def requeue(self, row: PromptRow) -> None:
        """A prompt whose group was too stale to train: generate it again."""
        self.ctx.prompts.give_back(row)
        asyncio.get_running_loop().create_task(self._notify())

    async def park(self) -> None:
        """At a stop (partial rollout): abort every group in flight and keep what it generated
        in `parked`, so the checkpoint holds the partial responses (tokens, behaviour log-probs,
        versions) and the resumed run continues them instead of starting over."""
        self.hold()
        self._parking = True
        n = self.ctx.cfg.rollout.n
        await self.ctx.rollout.abort([f"{uid}/{i}" for uid in self._running for i in range(n)])
        await self.drain()

    def continue_parked(self, groups: list[Group]) -> None:
        """Resume: these parked groups (their prompts claimed from the stream) go first."""
        self._to_continue = list(groups)

    def cancel(self) -> None:
        """Stop waiting for the groups in flight (the run is ending; their prompts stay
        outstanding in the prompt stream, so a checkpoint lists them)."""
        for task in self._tasks:
            task.cancel()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def hold(self) -> None:
        self._held = True

    def release(self) -> None:
        self._held = False
        asyncio.get_running_loop().create_task(self._notify())

    async def drain(self) -> None:
        """Wait until no group is in flight."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight == 0)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        """A failed generation fails the run with its own error, never a hang."""
        if self._error is not None:
            raise self._error

    def metrics(self) -> dict[str, float]:
        now = clock.now()
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        return {"rollouter/idle_ratio": idle / max(now - self._start_time, 1e-9),
                "rollouter/in_flight": self.in_flight, "rollouter/started": self.started,
                "rollouter/peak_in_flight": self.peak_in_flight,
                "fully_async/static/max_concurrent_samples": self.max_in_flight}
