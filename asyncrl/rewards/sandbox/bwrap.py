"""The `bwrap` backend: bubblewrap namespaces around the program, plus the rlimits of `limits.py`.

Each run: a new PID, network, IPC, UTS and cgroup namespace (no network at all, not even the
host's loopback; the program sees only its own processes), read-only binds of just what the
interpreter needs (/usr, the /lib and /bin links, the Python prefixes; no /sys, /home, /root, /work
other than the venv), a private `--tmpfs /tmp` of `sandbox.tmp_mb` as cwd (mode 1777: the slot uid
writes its scratch files there; root owns the mount), a 1 MiB tmpfs /dev/shm of the same mode
(multiprocessing's semaphores), `--clearenv`,
`--new-session`, `--die-with-parent`, and bwrap's nosuid mounts. The program runs as a uid of its
own (`process.uid_slot`): RLIMIT_NPROC then caps its processes without failing neighbours.
`process.BOOT` then installs the seccomp filter (`seccomp.py`: no sockets, no nested user namespace).

Why not `--unshare-all` and `--cap-drop ALL` as written: run as root, `--unshare-all` adds a user
namespace mapping only root, where no other uid exists to drop to; so we unshare every namespace
but the user one and keep only CAP_SETUID/CAP_SETGID, which `process.BOOT` spends on dropping to
the slot uid (losing every capability) before any model code runs, then sets no_new_privs. Not
root: plain `--unshare-all --cap-drop ALL`, no own uid, so no process cap (the PID namespace still
dies whole at the deadline).

The deadline kills bwrap's monitor process; its death takes PID 1 of the namespace and with it
every process inside, orphans and daemons included.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox import seccomp
from asyncrl.rewards.sandbox.base import RunResult
from asyncrl.rewards.sandbox.limits import MIB, limiter
from asyncrl.rewards.sandbox.process import BOOT, run_process, uid_slot

SHM_MB = 1
"""/dev/shm: room for multiprocessing's semaphores (a page each), not a second tmp."""
_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """bwrap is installed and works here (a container may forbid the namespaces it needs)."""
    path = shutil.which("bwrap")
    if path is None:
        return False
    probe = [path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def mounts(python: str) -> list[str]:
    """bwrap arguments for the system dirs and every Python prefix `python` needs, read-only."""
    args: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # The venv as the path names it too: a symlinked venv (a checkout's .venv -> elsewhere) is
    # reached through the link, which sys.prefix (resolved) does not name.
    prefixes = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(python))),
                os.path.dirname(os.path.dirname(os.path.abspath(python)))}
    bound: list[str] = []
    for prefix in sorted(prefixes, key=len):
        if not any(prefix == b or prefix.startswith(b + "/") for b in (*_SYSTEM, *bound)):
            args += [*_parents(prefix), "--ro-bind", prefix, prefix]
            bound.append(prefix)
    return args


def _parents(path: str) -> list[str]:
    """`--perms 0755 --dir` for each ancestor: bwrap would copy a host mode like /root's 0700,
    which the slot uid could not traverse."""
    args: list[str] = []
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return args


class BwrapSandbox:
    name = "bwrap"

    def __init__(self, cfg: SandboxConfig, python: str = sys.executable) -> None:
        self.cfg = cfg
        self.python = python
        self.bwrap = shutil.which("bwrap") or "bwrap"
        self.mounts = mounts(python)

    def argv(self, uid: int, program: str) -> list[str]:
        if uid >= 0:
            isolation = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                         "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            isolation = ["--unshare-all", "--cap-drop", "ALL"]
        return [self.bwrap, *isolation, "--die-with-parent", "--new-session", "--clearenv",
                "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
                "--hostname", "sandbox", "--perms", "1777", "--size", str(self.cfg.tmp_mb * MIB), "--tmpfs", "/tmp",
                *self.mounts, "--proc", "/proc", "--dev", "/dev",
                "--perms", "1777", "--size", str(SHM_MB * MIB), "--tmpfs", "/dev/shm",  # POSIX semaphores
                "--chdir", "/tmp",  # after /tmp: a venv may be there
                "--", self.python, "-I", "-c", BOOT, str(uid), seccomp.argument(), program]

    def run(self, program: str, stdin: str, timeout_s: float, *, marker: str = "",
            step_timeouts_s: Sequence[float] = ()) -> RunResult:
        with uid_slot() as uid:
            result = run_process(self.argv(uid, program), stdin, timeout_s, marker=marker,
                                 step_timeouts_s=step_timeouts_s, max_output=self.cfg.max_output_kb * 1024,
                                 preexec=limiter(self.cfg, timeout_s, own_uid=uid >= 0))
        if result.exit_code == 1 and result.stderr.startswith("bwrap:") and not result.stdout:
            return RunResult("sandbox_error", stderr=result.stderr, exit_code=1, wall_s=result.wall_s)
        return result
