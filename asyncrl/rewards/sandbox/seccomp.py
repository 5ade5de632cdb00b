"""The sandbox's seccomp filter: a classic-BPF program, assembled here, that `process.BOOT` installs
before any model-written code runs (both local backends; after the drop to the slot uid).

It refuses, with EPERM:
- `socket` and `socketpair`: the network is gone under bwrap anyway, but local socket pairs held
  buffer memory that no rlimit counts (one program held 683-780 MB in AF_UNIX socket pairs past
  its 1 GB RLIMIT_AS); a program that needs no network needs no socket. Pipes stay (subprocess
  needs them); their buffers are capped per uid by the kernel (`/proc/sys/fs/pipe-user-pages-soft`)
  and each run has a uid of its own.
- `memfd_create`, `shmget`, `msgget`: the same kind of memory (anonymous files, System V shared
  memory and message queues) outside RLIMIT_AS; measured: 768 MiB in memfds under a 512 MiB
  limit. System V objects would even outlive an rlimit run (no IPC namespace there). POSIX shared
  memory (multiprocessing) goes through /dev/shm, a 1 MiB tmpfs under bwrap.
- `unshare` and `clone` with CLONE_NEWUSER, and `setns`: no nested user namespace (inside one,
  the program would hold every capability over its new namespaces: kernel attack surface).
and answers ENOSYS to `clone3` (its flags sit in memory a filter cannot read; glibc falls back to
`clone`, which is checked), `io_uring_setup` (io_uring can open sockets without a syscall the
filter sees) and `memfd_secret`. Any other architecture than the host's native one (a 64-bit program's 32-bit
`int 0x80` calls, x32 calls on x86-64) gets ENOSYS for every call.

`unavailable()` probes once per process that the filter installs and refuses a socket pair here
(a container's own seccomp profile may forbid installing one); where it does not, programs run
without it and the sandbox's start line says why. Not here: installing it (`process.BOOT`, prctl).
Supported hosts: x86-64 and aarch64; elsewhere `program()` returns b"" and the sandbox says so.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
import subprocess
import sys

from asyncrl.rewards.sandbox.process import BOOT

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
"""BPF_LD|BPF_W|BPF_ABS; BPF_JMP|{BPF_JEQ,BPF_JGE,BPF_JSET}|BPF_K; BPF_RET|BPF_K."""
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16
"""Offsets in struct seccomp_data: syscall number, audit arch, low 32 bits of args[0] (little endian)."""
CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000


@functools.lru_cache(maxsize=1)
def _table() -> tuple[int, dict[str, int]] | None:
    """(AUDIT_ARCH, syscall numbers) of this machine's native ABI, or None where unsupported."""
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        return 0xC000003E, {"socket": 41, "socketpair": 53, "clone": 56, "unshare": 272, "setns": 308,
                            "io_uring_setup": 425, "clone3": 435, "memfd_create": 319, "memfd_secret": 447,
                            "shmget": 29, "msgget": 68}
    if machine in ("aarch64", "arm64"):
        return 0xC00000B7, {"socket": 198, "socketpair": 199, "unshare": 97, "clone": 220, "setns": 268,
                            "io_uring_setup": 425, "clone3": 435, "memfd_create": 279, "memfd_secret": 447,
                            "shmget": 194, "msgget": 186}
    return None


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _ret(action: int) -> bytes:
    return _op(_RET, action)


def program() -> bytes:
    """The filter as `struct sock_filter[]` bytes (b"" on an unsupported architecture).

    Layout: check the arch; load the number; one `jeq` per refused call straight to its return;
    `clone`/`unshare` jump to a check of CLONE_NEWUSER in their first argument."""
    table = _table()
    if table is None:
        return b""
    arch, nr = table
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    refuse = [(nr[name], eperm) for name in ("socket", "socketpair", "setns", "memfd_create", "shmget", "msgget")]
    refuse += [(nr[name], enosys) for name in ("clone3", "io_uring_setup", "memfd_secret")]
    checks = [*refuse, (nr["clone"], -1), (nr["unshare"], -1)]
    n = len(checks)
    # Index i of `checks` sits at 4 + i; after them: ALLOW (4+n), EPERM (4+n+1), ENOSYS (4+n+2),
    # then the flags check of clone/unshare (4+n+3). A jump's offset counts from the next instruction.
    head = [_op(_LD_W_ABS, _ARCH), _op(_JEQ, arch, jf=n + 4),  # foreign arch -> ENOSYS
            _op(_LD_W_ABS, _NR), _op(_JGE, _X32_BIT, jt=n + 2)]  # x32 numbers -> ENOSYS
    jumps = [_op(_JEQ, number, jt=(n + 3 if action == -1 else n + 1 if action == eperm else n + 2) - i - 1)
             for i, (number, action) in enumerate(checks)]
    tail = [_ret(_ALLOW), _ret(eperm), _ret(enosys),
            _op(_LD_W_ABS, _ARG0), _op(_JSET, CLONE_NEWUSER, jt=1), _ret(_ALLOW), _ret(eperm)]
    return b"".join([*head, *jumps, *tail])


_PROBE = ("import socket\ntry:\n socket.socketpair()\nexcept PermissionError:\n pass\n"
          "else:\n raise SystemExit('socketpair was allowed')")


@functools.lru_cache(maxsize=1)
def unavailable() -> str:
    """"" when the filter installs and refuses a socket pair on this host; else why not, one line."""
    filt = program()
    if not filt:
        return f"no seccomp filter for {platform.machine()} (x86-64 and aarch64 only)"
    try:
        probe = subprocess.run([sys.executable, "-I", "-c", BOOT, "-1", filt.hex(), _PROBE],
                               capture_output=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"seccomp probe failed: {exc}"
    if probe.returncode == 0:
        return ""
    lines = probe.stderr.decode(errors="replace").strip().splitlines()
    return f"seccomp filter not installed here ({lines[-1] if lines else f'exit {probe.returncode}'})"


def argument() -> str:
    """`process.BOOT`'s filter argument: the filter as hex where it works here, else ""."""
    return "" if unavailable() else program().hex()


__all__ = ["CLONE_NEWUSER", "argument", "program", "unavailable"]
