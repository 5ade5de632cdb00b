"""The resource limits every local run gets, set in the child between fork and exec (setrlimit).

- RLIMIT_AS = memory_mb (address space: a memory bomb gets MemoryError or dies);
- RLIMIT_CPU = the wall-clock timeout rounded up, plus 1 s (CPU seconds per process; the wall
  clock is the real limit, this stops a spinning process that somehow outlives it);
- RLIMIT_FSIZE = tmp_mb (no single file larger than the tmp);
- RLIMIT_NPROC = max_processes, only when the run has a uid of its own (`process.uid_slot`):
  the count is per real uid and host-wide, so on a shared uid concurrent runs would fail each
  other's forks;
- RLIMIT_CORE = 0, RLIMIT_NOFILE = 256.
Not here: which process gets them (`bwrap.py`, `rlimit.py`).
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable

from asyncrl.config.long_tail import SandboxConfig

MIB = 1 << 20


def limiter(cfg: SandboxConfig, timeout_s: float, own_uid: bool) -> Callable[[], None]:
    """A preexec function that applies the limits above (runs in the forked child)."""
    cpu_s = math.ceil(timeout_s) + 1
    limits = [(resource.RLIMIT_AS, cfg.memory_mb * MIB), (resource.RLIMIT_CPU, cpu_s),
              (resource.RLIMIT_FSIZE, cfg.tmp_mb * MIB), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 256)]
    if own_uid:
        limits.append((resource.RLIMIT_NPROC, cfg.max_processes))

    def apply() -> None:
        for which, value in limits:
            resource.setrlimit(which, (value, value))

    return apply
