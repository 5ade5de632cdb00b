"""Run one local sandboxed process: stream its output under deadlines and caps, then kill it all.

`run_process` starts `argv` in a session of its own, writes stdin, reads stdout and stderr
together up to `max_output` bytes, enforces the total and the per-step deadlines (see `base.py`),
and on any deadline or cap kills the whole process group. `uid_slot` leases a uid that no other
concurrent run on this host uses, so RLIMIT_NPROC (counted per real uid, host-wide) limits this
run's processes alone: at 4x concurrency correct programs never fail because a neighbour forked.
After the run, `sweep_uid` kills every process still owned by the leased uid (orphans that left the
process group) before the lease is given back.

Slots work only as root (setuid needs it); otherwise `uid_slot` yields -1 and the caller does not
set RLIMIT_NPROC. Not here: namespaces and mounts (`bwrap.py`), rlimits (`rlimit.py`).
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from asyncrl.rewards.sandbox.base import RunResult, RunStatus, SandboxError

SLOT_UID_BASE = 790_000
"""Slot k runs as uid SLOT_UID_BASE + k (no passwd entry needed; pick a range no one else uses)."""
MAX_SLOTS = 256
POLL_S = 0.05
"""How often the parent checks whether the program exited while something else holds its pipes."""
SLOT_DIR = "/tmp/asyncrl-sandbox-slots"

BOOT = (
    "import ctypes,os,sys\n"
    "u=int(sys.argv[1])\n"
    "if u>=0:\n os.setgroups([]);os.setgid(u);os.setuid(u)\n"
    "c=ctypes.CDLL(None,use_errno=True);L=ctypes.c_ulong\n"
    "c.prctl(38,L(1),L(0),L(0),L(0))\n"  # PR_SET_NO_NEW_PRIVS: a setuid binary cannot give root back
    "f=bytes.fromhex(sys.argv[2])\n"
    "if f:\n"  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, struct sock_fprog {len, filter*} (see seccomp.py)
    " b=ctypes.create_string_buffer(f,len(f))\n"
    " class P(ctypes.Structure):_fields_=[('n',ctypes.c_ushort),('f',ctypes.c_void_p)]\n"
    " q=P(len(f)//8,ctypes.addressof(b))\n"
    " if c.prctl(22,L(2),ctypes.byref(q),L(0),L(0)):\n"
    "  raise SystemExit('sandbox: seccomp refused: errno %d'%ctypes.get_errno())\n"
    "p=sys.argv[3];del sys.argv[1:4]\n"
    "exec(compile(p,'<program>','exec'),{'__name__':'__main__','__builtins__':__builtins__})\n"
)
"""Runs first inside the sandbox: drop to the slot uid (all capabilities go with root), set
no_new_privs, install the seccomp filter given as hex (`seccomp.program()`; "" for none), then
run the program. argv: uid, filter hex, program."""


@contextmanager
def uid_slot(wanted: bool = True) -> Iterator[int]:
    """A uid for this run alone (flock on a per-slot file, so it holds across processes); -1 if not root."""
    if os.geteuid() != 0 or not wanted:
        yield -1
        return
    os.makedirs(SLOT_DIR, mode=0o700, exist_ok=True)
    for k in range(MAX_SLOTS):
        fd = os.open(f"{SLOT_DIR}/slot-{k}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid = SLOT_UID_BASE + k
        try:
            sweep_uid(uid)  # a run before may have died before its own sweep
            yield uid
        finally:
            sweep_uid(uid)
            os.close(fd)  # releases the lock
        return
    raise SandboxError(f"all {MAX_SLOTS} sandbox uid slots are busy")


def sweep_uid(uid: int, limit_s: float = 2.0) -> None:
    """SIGKILL every live process owned by `uid` until none is left (a fork bomb is capped by NPROC).

    Zombies are left to their reaper (init); until reaped they still count against the slot's
    RLIMIT_NPROC, which is why a run's process cap is a little soft after a fork bomb."""
    deadline = time.monotonic() + limit_s
    while True:
        pids = _pids_of(uid)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)


def _pids_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid and not is_zombie(entry):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def is_zombie(pid: str) -> bool:
    """Dead, waiting for its new parent (pid 1 here) to reap it: nothing left to kill."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "Z"


def run_process(argv: Sequence[str], stdin: str, timeout_s: float, *, marker: str, step_timeouts_s: Sequence[float],
                max_output: int, preexec: Callable[[], None] | None = None, cwd: str | None = None,
                env: dict[str, str] | None = None) -> RunResult:
    """Run argv to its end or its first broken limit; see the module docstring."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=preexec, cwd=cwd, env=env if env is not None else {})
    except OSError as exc:
        return RunResult("sandbox_error", stderr=f"cannot start {argv[0]}: {exc}")
    stream = _Stream(proc, stdin.encode(), marker.encode(), max_output)
    try:
        status = stream.pump(start, timeout_s, list(step_timeouts_s))
    finally:
        stream.sel.close()
        _kill_group(proc)
    code = proc.returncode
    if status == "ok" and code is not None and code < 0:
        status = "killed"
    return RunResult(status, stream.text(1), stream.text(2), code, time.monotonic() - start, tuple(stream.step_s))


class _Stream:
    """The parent's side of one run: feeds stdin, collects output, times marked lines."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes, marker: bytes, max_output: int) -> None:
        self.proc = proc
        self.pending = stdin
        self.marker = marker
        self.max_output = max_output
        self.out: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.scanned = 0
        self.marks: list[float] = []
        self.step_s: list[float] = []
        self.sel = selectors.DefaultSelector()

    def pump(self, start: float, timeout_s: float, steps: list[float]) -> RunStatus:
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._register(self.proc.stdout, 1, selectors.EVENT_READ)
        self._register(self.proc.stderr, 2, selectors.EVENT_READ)
        if self.pending:
            self._register(self.proc.stdin, 0, selectors.EVENT_WRITE)
        else:
            self.proc.stdin.close()
        readers = 2
        while readers:
            left = self._deadline(start, timeout_s, steps) - time.monotonic()
            if left <= 0:
                return "timeout"
            exited = self.proc.poll() is not None  # before reading: all it wrote is in the pipes
            events = self.sel.select(0.0 if exited else min(left, POLL_S))
            for key, _ in events:
                if key.data == 0:
                    self._feed(key.fileobj)  # type: ignore[arg-type]
                elif not self._read(key):
                    readers -= 1
                if len(self.out[1]) + len(self.out[2]) > self.max_output:
                    return "output_limit"
            if exited and not events:  # drained; what still holds the pipes is an orphan: the sweep gets it
                break
        try:  # both pipes closed: the program is exiting
            self.proc.wait(max(0.0, self._deadline(start, timeout_s, steps) - time.monotonic()))
        except subprocess.TimeoutExpired:
            return "timeout"
        return "ok"

    def _read(self, key: selectors.SelectorKey) -> bool:
        """Read what one pipe has; False at its end."""
        try:
            chunk = os.read(key.fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            self.sel.unregister(key.fileobj)
            return False
        self.out[key.data] += chunk
        if key.data == 1:
            self._scan()
        return True

    def _register(self, pipe: IO[bytes], tag: int, events: int) -> None:
        os.set_blocking(pipe.fileno(), False)
        self.sel.register(pipe, events, tag)

    def _feed(self, pipe: IO[bytes]) -> None:
        try:
            self.pending = self.pending[os.write(pipe.fileno(), self.pending[:65536]):]
        except BlockingIOError:
            return
        except BrokenPipeError:  # the program closed its stdin: the rest is not wanted
            self.pending = b""
        if not self.pending:
            self.sel.unregister(pipe)
            pipe.close()

    def _scan(self) -> None:
        """Time every newly completed stdout line that starts with the marker."""
        buf = self.out[1]
        while (end := buf.find(b"\n", self.scanned)) >= 0:
            if self.marker and buf.startswith(self.marker, self.scanned):
                now = time.monotonic()
                if self.marks:
                    self.step_s.append(now - self.marks[-1])
                self.marks.append(now)
            self.scanned = end + 1

    def _deadline(self, start: float, timeout_s: float, steps: list[float]) -> float:
        deadline = start + timeout_s
        k = len(self.marks) - 1  # the step now running
        if 0 <= k < len(steps):
            deadline = min(deadline, self.marks[-1] + steps[k])
        return deadline

    def text(self, fd: int) -> str:
        return bytes(self.out[fd][:self.max_output]).decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's process group (bwrap: its monitor, whose death takes the PID namespace)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None and not pipe.closed:
            pipe.close()
