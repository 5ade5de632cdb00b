"""The sandbox's seccomp filter, syscall by syscall, in a plain process (no namespaces), and the
sandbox's start line. The attacks through a whole sandbox are in `test_sandbox.py`."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox import make_sandbox, seccomp, start_line
from asyncrl.rewards.sandbox.process import BOOT

CHECKS = """
import ctypes, errno, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
arm = platform.machine() in ("aarch64", "arm64")
nr = dict(clone=220 if arm else 56, clone3=435, io_uring_setup=425, setns=268 if arm else 308, memfd_secret=447)
def call(name, *args):
    r = libc.syscall(ctypes.c_long(nr[name]), *[ctypes.c_long(a) for a in args])
    if r == 0:  # a clone that went through: the child leaves at once
        os._exit(0)
    return errno.errorcode.get(ctypes.get_errno(), "ok") if r < 0 else "ok"
out = {}
for name, make in (("socket", lambda: socket.socket()), ("socketpair", socket.socketpair)):
    try:
        make()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
out["unshare_user"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
out["clone_user"] = call("clone", 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
out["clone3"] = call("clone3", 0, 0)
out["io_uring_setup"] = call("io_uring_setup", 8, 0)
out["setns"] = call("setns", 0, 0)
out["memfd_secret"] = call("memfd_secret", 0)
try:
    os.memfd_create("x")
    out["memfd_create"] = "ok"
except OSError as e:
    out["memfd_create"] = errno.errorcode[e.errno]
for name, args in (("shmget", (0, 1 << 20, 0o1600)), ("msgget", (0, 0o1600))):  # IPC_PRIVATE, IPC_CREAT|0600
    r = getattr(libc, name)(*args)
    out[name] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
    if r >= 0:  # remove what was made (IPC_RMID)
        (libc.shmctl if name == "shmget" else libc.msgctl)(r, 0, None)
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = "ok" if os.waitpid(pid, 0)[1] >> 8 == 7 else "broken"
r, w = os.pipe()
out["pipe"] = "ok" if os.write(w, b"x") == 1 else "broken"
print(out)
"""


def test_filter_refuses_sockets_and_user_namespaces_and_keeps_fork() -> None:
    if missing := seccomp.unavailable():
        pytest.skip(missing)
    proc = subprocess.run([sys.executable, "-I", "-c", BOOT, "-1", seccomp.argument(), CHECKS],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert eval(proc.stdout) == {"socket": "EPERM", "socketpair": "EPERM", "unshare_user": "EPERM",
                                 "clone_user": "EPERM", "clone3": "ENOSYS", "io_uring_setup": "ENOSYS",
                                 "setns": "EPERM", "memfd_secret": "ENOSYS", "memfd_create": "EPERM",
                                 "shmget": "EPERM", "msgget": "EPERM", "fork": "ok", "pipe": "ok"}


def test_without_the_filter_the_same_calls_are_not_refused_by_boot() -> None:
    """The checks above can fail: with no filter, sockets and fork work (the filter is what refuses)."""
    proc = subprocess.run([sys.executable, "-I", "-c", BOOT, "-1", "", CHECKS], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = eval(proc.stdout)
    assert [seen[k] for k in ("socket", "socketpair", "memfd_create", "shmget", "msgget", "fork")] == ["ok"] * 6


def test_start_line_says_what_is_guaranteed(caplog: pytest.LogCaptureFixture) -> None:
    cfg = SandboxConfig(backend="rlimit", tmp_mb=8)
    with caplog.at_level(logging.INFO, logger="asyncrl.sandbox"):
        make_sandbox(cfg)
    line = start_line("rlimit", cfg)
    assert line in caplog.messages and "8 MiB writable by the program" in line
    if missing := seccomp.unavailable():
        assert f"NOT refused: {missing}" in line
    else:
        assert "sockets and nested user namespaces refused (seccomp)" in line
