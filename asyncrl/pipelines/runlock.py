"""One run per run directory: an advisory lock on `OUTPUT_DIR/run.lock`, held for the run's life.

`hold_run_dir(out)` takes an exclusive `fcntl.flock` on the file before the run writes anything
else in `out`, and writes its holder in it (`{"host", "pid", "since"}`). A second run on the same
directory is refused in one line naming the holder (`RunDirBusy`), before it has touched a file.
The kernel drops the lock when the holding process ends, however it ends (kill -9 too); a run
that ends cleanly empties the file as it lets go. A lock file that still names a process, whose
lock is free, was left by a run that died: the next run takes it over and says so in one line.

flock excludes processes on one host, and on NFSv4 (where Linux maps it onto byte-range locks)
processes on different hosts; some network filesystems ignore it, and there the lock file still
names the last holder. The file stays (removing it would race with a run taking it).
Not here: the partial checkpoint names (`checkpoint.partial_dir`), unique per writer besides.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from asyncrl.errors import RunDirBusy

LOCK_FILE = "run.lock"


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """A held run-directory lock; `release()` (or this process's end) lets it go."""

    def __init__(self, path: Path, file: IO[str]) -> None:
        self.path, self._file = path, file

    def release(self) -> None:
        """Empty the file (a clean end: nothing stale left to report) and drop the lock; idempotent."""
        if self._file.closed:
            return
        with contextlib.suppress(OSError):
            self._file.truncate(0)
            self._file.flush()
        self._file.close()


def hold_run_dir(out: Path, log: Callable[[str], None]) -> RunLock:
    """Lock `out` (created if missing) for this run, or raise `RunDirBusy` naming the holder."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    file = path.open("a+")  # not inherited by programs this process starts (O_CLOEXEC)
    if not _try_lock(file):
        holder = _holder(file)
        file.close()
        raise RunDirBusy(f"{out} is in use by another run ({_describe(holder)}, lock {path}); wait for it to "
                         "end, or set trainer.output_dir to another directory") from None
    stale = _holder(file)
    if stale.get("pid") is not None and stale.get("pid") != os.getpid():
        log(f"warning: {path}: took over the stale lock of {_describe(stale)} (that run ended without releasing it)")
    file.truncate(0)
    file.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    file.flush()
    return RunLock(path, file)


def _try_lock(file: IO[str]) -> bool:
    """Take the lock if it is free. Held by this very process: once more after a garbage
    collection, which closes the lock of an earlier run's context that only a cycle still holds."""
    for attempt in range(2):
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            holder = _holder(file)
            if attempt or (holder.get("pid"), holder.get("host")) != (os.getpid(), socket.gethostname()):
                return False
            gc.collect()
    return False


def _holder(file: IO[str]) -> dict[str, Any]:
    file.seek(0)
    try:
        holder = json.loads(file.read() or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    pid, host = holder.get("pid"), holder.get("host")
    if pid is None:
        return "holder not yet written"
    text = f"pid {pid} on {host} since {holder.get('since')}"
    if host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        text += f"; pid {pid} has exited, a process it started holds the lock"
    return text
