"""The `rlimit` backend: a plain subprocess with resource limits; the fallback when bwrap is missing.

Contains: memory (RLIMIT_AS), CPU time, single-file size, wall clock (the parent kills the
process group), output floods (the parent caps its reads), the parent's environment (the child
gets a cleared env and runs `python -I`), and, when we are root, processes and files: the program
runs as a uid of its own (`process.uid_slot`), so RLIMIT_NPROC caps a fork bomb without touching
other runs, it cannot signal the reward worker or read its /proc/<pid>/environ, it cannot write
files only root may write, and every process of that uid is killed after the run (orphans that
left the process group included). Its cwd is a fresh temp dir, deleted afterwards.

The seccomp filter (`seccomp.py`, where this host can install it) refuses sockets and nested user
namespaces, which is what keeps the program off the network here: there is no network namespace.
Does NOT contain: writes to world-writable places (/tmp, /dev/shm: RLIMIT_FSIZE caps one file,
not the disk), reading files the world may read. Not root: no own uid, so no process cap, and the
program can kill the worker.

The own uid must be able to read the interpreter: when `sys.executable` lives under a directory
others cannot enter (a pyenv under /root), the program runs on the system `python3` instead
(stdlib only, no venv packages); when neither is readable, it runs without an own uid (warned).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox import seccomp
from asyncrl.rewards.sandbox.base import RunResult
from asyncrl.rewards.sandbox.limits import limiter
from asyncrl.rewards.sandbox.process import BOOT, run_process, uid_slot

log = logging.getLogger("asyncrl.sandbox")
_warned = False


class RlimitSandbox:
    name = "rlimit"

    def __init__(self, cfg: SandboxConfig, python: str = sys.executable) -> None:
        global _warned
        self.cfg = cfg
        self.python = python
        self.own_uid = True
        if os.geteuid() == 0 and not readable_by_others(python):
            system = shutil.which("python3", path="/usr/bin:/bin") or ""
            self.own_uid = bool(system) and readable_by_others(system)
            self.python = system if self.own_uid else python
            if not self.own_uid:
                log.warning("sandbox.backend=rlimit: %s is not readable by other users; programs run as "
                            "root without a process cap", python)
        if not _warned:
            _warned = True
            log.warning("sandbox.backend=rlimit: model-written code runs with resource limits but WITHOUT "
                        "network or file-system isolation; install bubblewrap (apt-get install bubblewrap) "
                        "for sandbox.backend=bwrap")

    def run(self, program: str, stdin: str, timeout_s: float, *, marker: str = "",
            step_timeouts_s: Sequence[float] = ()) -> RunResult:
        cwd = tempfile.mkdtemp(prefix="asyncrl-sandbox-")
        try:
            with uid_slot(self.own_uid) as uid:  # its exit kills the uid's leftovers: before the rmtree
                if uid >= 0:
                    os.chown(cwd, uid, uid)
                argv = [self.python, "-I", "-c", BOOT, str(uid), seccomp.argument(), program]
                env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
                return run_process(argv, stdin, timeout_s, marker=marker, step_timeouts_s=step_timeouts_s,
                                   max_output=self.cfg.max_output_kb * 1024, cwd=cwd, env=env,
                                   preexec=limiter(self.cfg, timeout_s, own_uid=uid >= 0))
        finally:
            shutil.rmtree(cwd, ignore_errors=True)


def readable_by_others(path: str) -> bool:
    """Can any user run `path` (every ancestor of its real path enterable, the file readable)?"""
    real = os.path.realpath(path)
    if not os.path.exists(real) or not os.stat(real).st_mode & 0o004:
        return False
    parent = os.path.dirname(real)
    while True:
        if not os.stat(parent).st_mode & 0o001:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)
