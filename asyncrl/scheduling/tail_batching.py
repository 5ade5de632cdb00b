"""Tail batching (RollPacker, SPEC §4) as a pure policy: which round comes next and how big.

A step trains P0 prompts x R0 responses. A **short round** launches ceil(eta_p x P0) prompts
with ceil(eta_r x R0) responses each; a prompt is done when its first R0 responses finish (the
rest are aborted), the round ends when P0 prompts are done, and the prompts still running are
aborted and queued. Once the **long-prompt queue** holds P0 prompts, the next round is a **long
round**: exactly the P0 oldest queued prompts, R0 responses each, no speculation. A prompt is
never dropped: the sample distribution is reordered, not filtered.

Not here: running a round (`asyncrl.pipelines.tail_rounds`), the prompt stream. Items in the
queue are opaque (the pipeline keeps prompt rows in it); no clocks, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
EPS = 1e-9  # 1.25 x 8 is 10.000000000000002 in floats: not 11


@dataclass(frozen=True)
class Round:
    """One round's shape: launch `launch_prompts` x `launch_responses`, train `keep_prompts` x
    `keep_responses`."""

    kind: Literal["short", "long"]
    launch_prompts: int
    launch_responses: int
    keep_prompts: int
    keep_responses: int


class TailBatcher(Generic[T]):
    """Example: P0=8, R0=4, eta 1.25 each. A short round launches ceil(10) = 10 prompts x 5
    responses, keeps the first 4 finishers of each of the first 8 prompts done, and queues the
    2 prompts still running. After four such rounds the queue holds 8: the fifth round is long,
    8 queued prompts x 4 responses, and the queue is empty again.
    """

    def __init__(self, prompts: int, responses: int, prompt_speculation: float = 1.25,
                 response_speculation: float = 1.25) -> None:
        assert prompts >= 1 and responses >= 1, (prompts, responses)
        assert prompt_speculation >= 1 and response_speculation >= 1, (prompt_speculation, response_speculation)
        self.prompts, self.responses = prompts, responses
        self.prompt_speculation, self.response_speculation = prompt_speculation, response_speculation
        self.queue: deque[T] = deque()

    def next_round(self) -> Round:
        if len(self.queue) >= self.prompts:
            return Round("long", self.prompts, self.responses, self.prompts, self.responses)
        return Round("short", _speculate(self.prompts, self.prompt_speculation),
                     _speculate(self.responses, self.response_speculation), self.prompts, self.responses)

    def take_long(self) -> list[T]:
        """The long round's prompts: the P0 oldest in the queue."""
        assert len(self.queue) >= self.prompts, "take_long without a full queue"
        return [self.queue.popleft() for _ in range(self.prompts)]

    def enqueue(self, items: list[T]) -> None:
        """Prompts a short round aborted while they still ran."""
        self.queue.extend(items)


def _speculate(count: int, factor: float) -> int:
    return math.ceil(count * factor - EPS)
