"""An asyncio event loop on a virtual clock: when nothing is runnable, time jumps to the next timer.

`run_virtual(coro)` runs a coroutine (a whole pipeline) on it. `loop.time()` is virtual, so
`asyncio.sleep(3600)` returns at once with the clock one hour later, and `telemetry.clock`
reads the same virtual seconds for the run's timers and trace. Callbacks run in exactly the
order a real loop would run them, so the pipelines' coroutines cannot tell the difference.

Not covered: real I/O and threads. A modelled worker must `await` virtual sleeps, never block
or hand work to a thread; if the loop has nothing scheduled and nothing ready it would wait on
real I/O, which in a simulation means a deadlock, so it raises `SimDeadlock` instead.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import selectors
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

from asyncrl.telemetry.clock import use_clock

T = TypeVar("T")
_MAX_JUMP_S = 24 * 3600.0  # asyncio.base_events.MAXIMUM_SELECT_TIMEOUT


class SimDeadlock(RuntimeError):
    """Every coroutine waits and no timer is pending: the simulated run can never go on."""


class _JumpingSelector(selectors.SelectSelector):
    """Never waits on file descriptors (a simulation has no I/O); a wait for a timer advances
    the clock by exactly that long."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimDeadlock("the simulated run is stuck: every task waits and no timer is set")
        self.now += max(timeout, 0.0)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumper = _JumpingSelector()
        super().__init__(self._jumper)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._jumper.now

    def _run_once(self) -> None:
        """CPython's `BaseEventLoop._run_once` without I/O polling or debug timing (a simulation
        spends a tenth of its time here): the same callbacks in the same order, and the clock
        jumps exactly as `_JumpingSelector.select` moves it."""
        self._drop_cancelled_timers()
        loop: Any = self  # the base loop's private state, which typeshed does not declare
        scheduled: list[Any] = loop._scheduled
        ready: deque[Any] = loop._ready
        jumper = self._jumper
        if not (ready or loop._stopping):
            jumper.select(min(max(0, scheduled[0]._when - jumper.now), _MAX_JUMP_S) if scheduled else None)
        end_time = jumper.now + self._clock_resolution
        while scheduled and scheduled[0]._when < end_time:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _drop_cancelled_timers(self) -> None:
        """As `_run_once` does: all of them when they are many, else those at the heap's head."""
        loop: Any = self
        scheduled: list[Any] = loop._scheduled
        if len(scheduled) > 100 and loop._timer_cancelled_count / len(scheduled) > 0.5:
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
            loop._scheduled = [h for h in scheduled if not h._cancelled]
            heapq.heapify(loop._scheduled)
            loop._timer_cancelled_count = 0
            return
        while scheduled and scheduled[0]._cancelled:
            loop._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False


def run_virtual(coro: Coroutine[Any, Any, T]) -> tuple[T, float]:
    """Run `coro` to completion in virtual time: (its result, virtual seconds elapsed).

    The cyclic garbage collector is paused meanwhile: a simulated run allocates millions of
    short-lived objects that reference counting frees, and the collector's passes over the
    long-lived ones cost more than the simulation itself. It collects once at the end."""
    loop = VirtualClockLoop()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with use_clock(loop.time):
            result = loop.run_until_complete(coro)
        return result, loop.time()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        if was_enabled:
            gc.enable()
        gc.collect()
