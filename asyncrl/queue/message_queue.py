"""The bounded buffer of finished groups between the rollouter and the trainer (SPEC §3).

A FIFO with a capacity: `put` waits while full, `get` waits while empty, and both waits are
measured (a full queue or a starved trainer is visible, never silent). The stream ends when the
trainer has what it needs (the pipeline stops; nothing is closed). It lives in the driver
process and holds plain `Group`s; it does not decide staleness (see `scheduling.staleness`).
"""

from __future__ import annotations

import asyncio
from collections import deque

from asyncrl.telemetry import clock
from asyncrl.types import Group


class MessageQueue:
    def __init__(self, capacity: int) -> None:
        assert capacity > 0
        self.capacity = capacity
        self._items: deque[Group] = deque()
        self._changed = asyncio.Condition()
        self.put_wait_s = 0.0
        self.get_wait_s = 0.0
        self.total_put = 0
        self.max_size = 0

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, group: Group) -> None:
        start = clock.now()
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._items) < self.capacity)
            self._items.append(group)
            self.total_put += 1
            self.max_size = max(self.max_size, len(self._items))
            self._changed.notify_all()
        self.put_wait_s += clock.now() - start

    async def get(self) -> Group:
        """The oldest group (waits while empty)."""
        start = clock.now()
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            item = self._items.popleft()
            self._changed.notify_all()
        self.get_wait_s += clock.now() - start
        return item

    @property
    def items(self) -> list[Group]:
        """The queued groups, oldest first (a checkpoint saves them)."""
        return list(self._items)

    def put_back(self, groups: list[Group]) -> None:
        """Return groups taken but not trained (a stop) to the front, in their order."""
        self._items.extendleft(reversed(groups))

    def restore(self, groups: list[Group]) -> None:
        """Queue groups saved by a checkpoint (before anything is put or got)."""
        assert not self._items, "restore into an empty queue"
        self._items.extend(groups)
        self.max_size = max(self.max_size, len(self._items))

    def metrics(self) -> dict[str, float]:
        return {"fully_async/queue/size": len(self._items), "fully_async/queue/max_size": self.max_size,
                "fully_async/queue/put_wait_s": self.put_wait_s,
                "fully_async/queue/get_wait_s": self.get_wait_s}
