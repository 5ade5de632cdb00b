"""The message queue: FIFO, bounded (put waits), waits measured."""

from __future__ import annotations

import asyncio

from asyncrl.queue.message_queue import MessageQueue
from asyncrl.types import Group, PromptRow


def group(i: int) -> Group:
    return Group(uid=str(i), row=PromptRow(uid=str(i), data_source="x", messages=(), ground_truth=""),
                 trajectories=[])


def test_fifo_and_bounded():
    async def main():
        q = MessageQueue(capacity=2)
        await q.put(group(0))
        await q.put(group(1))
        blocked = asyncio.create_task(q.put(group(2)))
        await asyncio.sleep(0.01)
        assert not blocked.done() and len(q) == 2
        assert (await q.get()).uid == "0"
        await blocked
        got = [(await q.get()).uid, (await q.get()).uid]
        assert got == ["1", "2"] and len(q) == 0
        assert q.put_wait_s > 0.005 and q.max_size == 2 and q.total_put == 3

    asyncio.run(main())


def test_groups_put_back_come_out_first_in_their_order():
    async def main():
        q = MessageQueue(capacity=4)
        for i in range(3):
            await q.put(group(i))
        taken = [await q.get(), await q.get()]
        q.put_back(taken)  # a stop: taken, not trained
        assert [g.uid for g in q.items] == ["0", "1", "2"]

    asyncio.run(main())
