"""Stopping a run on SIGINT / SIGTERM without losing or doubling anything.

The first signal sets `StopControl.requested`. Waits for generation (`race`) end at once with
`Stopped`; an update in flight is finished, never cut (its weights and its prompts must agree);
the pipeline then checks (`check`) at its next step boundary and raises `Stopped`, and
`pipelines.common.guarded` writes a checkpoint of the last finished update. If that takes longer
than `trainer.stop_timeout_s`, or a second signal arrives, the process exits at once with 128 +
the signal number: the last complete checkpoint is untouched, because a checkpoint becomes
visible only by a rename once it is whole (`pipelines.checkpoint`).

Signal handlers are installed only by `handle_signals` (the CLI's `asyncrl train`); tests and
the simulator call `request` directly.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from asyncrl.errors import AsyncRLError

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(AsyncRLError):
    """The run stopped on a signal after checkpointing; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopControl:
    def __init__(self, timeout_s: float, log: Callable[[str], None] = print) -> None:
        self.timeout_s = timeout_s
        self.log = log
        self.signum: int | None = None
        self._event: asyncio.Event | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _stop_event(self) -> asyncio.Event:
        if self._event is None:  # created lazily: it must belong to the running loop
            self._event = asyncio.Event()
            if self.requested:
                self._event.set()
        return self._event

    def request(self, signum: int) -> None:
        """A stop signal: the first stops the run cleanly, a second exits at once."""
        if self.requested:
            self.log(f"asyncrl: second {signal.Signals(signum).name}: exiting now, the last complete checkpoint stays")
            os._exit(128 + signum)
            return  # (os._exit does not return; a test's stand-in does)
        self.signum = signum
        self._stop_event().set()
        self.log(f"asyncrl: {signal.Signals(signum).name}: stopping generation, finishing the update in flight "
                 f"and saving a checkpoint (at most {self.timeout_s:g} s; signal again to exit at once)")
        asyncio.get_running_loop().call_later(self.timeout_s, self._overdue, signum)

    def _overdue(self, signum: int) -> None:
        self.log(f"asyncrl: not stopped within trainer.stop_timeout_s={self.timeout_s:g} s: exiting without a new "
                 "checkpoint; the last complete one stays")
        os._exit(128 + signum)

    def check(self) -> None:
        """At a step boundary: raise `Stopped` if a stop was requested."""
        if self.signum is not None:
            raise Stopped(self.signum)

    async def race(self, awaitable: Awaitable[T]) -> T:
        """Await a wait for samples, or raise `Stopped` (cancelling it) when a stop comes first."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stop_event().wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        self.check()
        raise AssertionError("unreachable: the stop event is set only with a signal")


@contextmanager
def handle_signals(control: StopControl) -> Iterator[None]:
    """Route SIGINT and SIGTERM to `control` while the block runs (inside the event loop)."""
    loop = asyncio.get_running_loop()
    for signum in SIGNALS:
        loop.add_signal_handler(signum, control.request, signum)
    try:
        yield
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)
