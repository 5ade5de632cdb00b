"""The clock every pipeline-level duration and trace stamp reads: wall time, or virtual time.

Real runs read `time.time()` (seconds since the epoch, so stamps taken in Ray actors line up
with the driver's). The simulator swaps in its event loop's virtual clock with `use_clock`, so
the same timers, idle ratios and trace spans measure modelled time without a line changing in
the pipelines. Engines and rewards that time their own work in real runs keep using `time`
directly: they never run under the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_now: Callable[[], float] = time.time


def now() -> float:
    """Seconds on the current clock."""
    return _now()


@contextmanager
def use_clock(clock: Callable[[], float]) -> Iterator[None]:
    """Read `clock` instead of wall time inside the block (one clock per process at a time)."""
    global _now
    previous, _now = _now, clock
    try:
        yield
    finally:
        _now = previous
