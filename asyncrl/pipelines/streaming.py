"""The stream trainer inside the colocated pipeline (SPEC §4): once generation has become
tail-bound, each finished group's log-probs and gradients are computed while the rest still
generate; the one optimizer step comes when the whole batch is in.

    engines  [gen ██████████████▌ (the tail) ▌]
    trainer            ▲ trigger  [grads g1..g9][g10][g11]   [rest][step]
             └ done fraction checked at 20%, 25%, ... 50% ┘

When to start is the pure `asyncrl.scheduling.stream_trigger.StreamTrigger`, fed the done
fraction and the engines' running/waiting counts; the gradients and the renormalised step are the
trainer's (`accumulate_groups` / `apply_update`), so the update equals the plain step on the same
batch. This module only connects them: it does not choose groups (the batch producer does) and
never trains a group twice or leaves one out (`finish` takes the batch actually trained).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from asyncrl.pipelines.context import RunContext
from asyncrl.scheduling.stream_trigger import StreamTrigger
from asyncrl.types import Group


class StreamFeeder:
    """One batch's streaming: `on_group` as each group is done, then `finish(groups)` as the
    update that `common.train` awaits."""

    def __init__(self, ctx: RunContext, trigger: StreamTrigger) -> None:
        self.ctx = ctx
        self.trigger = trigger
        trigger.reset()
        self.batch_size = ctx.cfg.data.train_batch_size
        self.done = 0
        self._ready: list[Group] = []
        self._fed: set[str] = set()
        self._worker: asyncio.Task[None] | None = None

    def on_group(self, group: Group) -> None:
        """A group of the batch is done (scored): train it now if streaming has started."""
        self.done += 1
        self._ready.append(group)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._feed())

    async def _feed(self) -> None:
        while self._ready:
            if not self.trigger.fired:
                stats = await self.ctx.rollout.stats()
                if not self.trigger.observe(self.done / self.batch_size, int(stats["rollouter/running"]),
                                            int(stats["rollouter/waiting"])):
                    return
            chunk, self._ready = self._ready, []
            self._fed |= {g.uid for g in chunk}
            await self.ctx.trainer.accumulate_groups(chunk)

    async def finish(self, groups: Sequence[Group]) -> dict[str, float]:
        """The update on `groups`: the gradients of those not streamed yet, then the one step."""
        early = len(self._fed)  # gradients computed (or under way) while generation went on
        if self._worker is not None:
            await self._worker
        assert self._fed <= {g.uid for g in groups}, "a streamed group is missing from the batch trained"
        rest = [g for g in groups if g.uid not in self._fed]
        if rest:
            await self.ctx.trainer.accumulate_groups(rest)
        metrics = await self.ctx.trainer.apply_update()
        fired_at = self.trigger.fired_at
        return metrics | {"stream_trainer/streamed_groups": float(early),
                          "stream_trainer/fired_at": fired_at if fired_at is not None else -1.0}

    def cancel(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
