"""Attacks on the sandbox: each is contained, scores as failure, and leaves the host intact.

Runs for the bwrap backend (skipped only when bwrap is absent) and for rlimit where rlimit can
contain the attack. The rlimit fallback's known limits, by design (see `sandbox/rlimit.py`): no
network namespace (the seccomp filter's refusal of socket() is what keeps it off 127.0.0.1) and no
file-system isolation beyond the uid (world-writable dirs are writable); the uid-based containment
(process cap, no writes to root-owned dirs, no signals to the worker, orphans swept) needs root, so
those cases skip otherwise. The seccomp cases (sockets, nested user namespaces) skip only where
`seccomp.unavailable()` gives the reason this host cannot install the filter.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.code_exec import code_score, compute_code
from asyncrl.rewards.sandbox import Sandbox, make_sandbox, seccomp
from asyncrl.rewards.sandbox.bwrap import available
from asyncrl.rewards.sandbox.process import MAX_SLOTS, SLOT_DIR, SLOT_UID_BASE, is_zombie

CFG = SandboxConfig(memory_mb=512, tmp_mb=8, max_output_kb=64, max_processes=16)
ONE = json.dumps({"fn_name": "f", "tests": [{"input": [1], "output": 4}, {"input": [2], "output": 7}]})
ROOT = os.geteuid() == 0
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(not available(), reason="bwrap not installed")), "rlimit"]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return make_sandbox(SandboxConfig(**{**CFG.__dict__, "backend": request.param}))


def score(sandbox: Sandbox, body: str, timeout_s: float = 1.0) -> dict[str, float]:
    """Score a solution whose f returns the right answer only if the attack in `body` got through."""
    start = time.monotonic()
    result = code_score(f"```python\n{body}\n```", ONE, timeout_s, sandbox=sandbox)
    assert time.monotonic() - start < 4 * timeout_s + 3.0  # never a hang
    return result


def slot_processes() -> list[int]:
    """Processes still owned by a sandbox slot uid that no run holds (there must be none after a
    run). A slot another run holds (the other pytest worker's, say) is locked: its processes are
    that run's, and it is left alone; a free slot is held while its processes are counted."""
    uids = range(SLOT_UID_BASE, SLOT_UID_BASE + MAX_SLOTS)
    found = []
    for uid in {owner for pid in os.listdir("/proc") if (owner := live_owner(pid)) in uids}:
        fd = os.open(f"{SLOT_DIR}/slot-{uid - SLOT_UID_BASE}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            found += [int(pid) for pid in os.listdir("/proc") if live_owner(pid) == uid]
        except BlockingIOError:
            continue  # held by a run in progress
        finally:
            os.close(fd)
    return found


def live_owner(pid: str) -> int:
    """The uid of a live process (-1: not a process, gone, or a zombie)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid if pid.isdigit() and not is_zombie(pid) else -1
    except OSError:
        return -1


def needs_root_for_rlimit(sandbox: Sandbox) -> None:
    if sandbox.name == "rlimit" and not ROOT:
        pytest.skip("rlimit contains this only when it can give the run a uid of its own (root)")


def assert_host_intact(sandbox: Sandbox) -> None:
    assert slot_processes() == []
    result = score(sandbox, "def f(x):\n    return x*3+1")
    assert result["score"] == 1.0, result


def test_correct_and_wrong_through_compute_code() -> None:
    good = compute_code("code", "```python\ndef f(x):\n    return x*3+1\n```", ONE, {})
    wrong = compute_code("code", "```python\ndef f(x):\n    return x\n```", ONE, {"code_timeouts_s": [1.0, 1.0]})
    assert (good["score"], good["acc"], wrong["score"], wrong["acc"]) == (1.0, 1.0, 0.0, 0.0)


def test_fork_bomb(sandbox: Sandbox) -> None:
    needs_root_for_rlimit(sandbox)
    body = "import os\ndef f(x):\n    n = 0\n    for _ in range(500):\n        if os.fork() == 0:\n" \
           "            import time; time.sleep(30)\n        n += 1\n    return x*3+1"
    assert score(sandbox, body)["score"] == 0.0  # fork fails at max_processes: f raises
    assert_host_intact(sandbox)


def test_connect_to_host_listener(sandbox: Sandbox) -> None:
    if sandbox.name == "rlimit":
        needs_seccomp()  # rlimit has no network namespace: the filter's refusal of socket() is its guard
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        body = f"import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n" \
               "    return x*3+1"
        assert score(sandbox, body)["score"] == 0.0
    assert_host_intact(sandbox)


def test_write_outside_tmp(sandbox: Sandbox, tmp_path: Path) -> None:
    needs_root_for_rlimit(sandbox)
    target = tmp_path / "pwned"
    os.chmod(tmp_path, 0o700)
    body = f"def f(x):\n    open({str(target)!r}, 'w').write('x')\n    return x*3+1"
    assert score(sandbox, body)["score"] == 0.0
    assert not target.exists()
    assert_host_intact(sandbox)


def test_fill_memory(sandbox: Sandbox) -> None:
    assert score(sandbox, "def f(x):\n    b = bytearray(2 << 30)\n    return x*3+1")["score"] == 0.0
    assert_host_intact(sandbox)


def test_scratch_files_in_tmp_score(sandbox: Sandbox) -> None:
    """An honest program that writes scratch files (in its cwd and through tempfile) scores."""
    body = "import tempfile\ndef f(x):\n    open('scratch.txt', 'w').write(str(x))\n" \
           "    with tempfile.NamedTemporaryFile('w+') as t:\n        t.write('y' * (1 << 20)); t.seek(0)\n" \
           "        assert len(t.read()) == 1 << 20\n    return int(open('scratch.txt').read())*3+1"
    assert score(sandbox, body)["score"] == 1.0


def test_fill_tmp(sandbox: Sandbox) -> None:
    """The tmp limit bites at sandbox.tmp_mb: writes succeed up to it, then fail with ENOSPC (bwrap's
    tmpfs, many files) or EFBIG (rlimit: RLIMIT_FSIZE on one file; many files there are a known limit)."""
    many = sandbox.name == "bwrap"
    program = "import errno\nn = 0\ntry:\n    for i in range(64):\n" \
              f"        with open({'f{i}' if many else 'big'!r}.format(i=i), {'wb' if many else 'ab'!r}) as out:\n" \
              "            out.write(bytes(1 << 20))\n        n += 1\nexcept OSError as e:\n" \
              "    print(n, errno.errorcode[e.errno])"
    result = sandbox.run(program, "", 5.0)
    written, code = result.stdout.split()
    assert CFG.tmp_mb - 1 <= int(written) <= CFG.tmp_mb and code == ("ENOSPC" if many else "EFBIG"), result
    assert_host_intact(sandbox)


def needs_seccomp() -> None:
    if missing := seccomp.unavailable():
        pytest.skip(missing)


def test_nested_user_namespace_is_refused(sandbox: Sandbox) -> None:
    needs_seccomp()
    body = "import ctypes, subprocess\ndef f(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n" \
           "    ok = libc.unshare(0x10000000) == 0\n" \
           "    ok = ok or subprocess.run(['unshare', '-U', 'true'], capture_output=True).returncode == 0\n" \
           "    return x*3+1 if ok else None"
    assert score(sandbox, body)["score"] == 0.0
    assert_host_intact(sandbox)


HOARD = {  # kernel memory RLIMIT_AS does not count, if the kernel lets it (socket pairs: 16 MiB in the
    # 256 fds one process may hold, 28 MiB without the filter; memfd, shm: 64 MiB)
    "socket pairs": "import socket\nsocks = []\ndef hoard():\n    held = 0\n    while held < 16 << 20:\n"
                    "        a, b = socket.socketpair(); socks.extend((a, b)); a.setblocking(False)\n"
                    "        try:\n            while True:\n                held += a.send(bytes(65536))\n"
                    "        except BlockingIOError:\n            pass\n",
    "memfd": "import os\nfds = []\ndef hoard():\n    for _ in range(8):\n        fds.append(os.memfd_create('x'))\n"
             "        for _ in range(8):\n            os.write(fds[-1], bytes(1 << 20))\n",
    "System V shm": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
                    "def hoard():\n    seg = libc.shmget(0, 64 << 20, 0o1600)\n    assert seg >= 0\n"
                    "    addr = libc.shmat(seg, None, 0)\n    ctypes.memset(addr, 1, 64 << 20)\n"
                    "    libc.shmdt(ctypes.c_void_p(addr))\n    libc.shmctl(seg, 0, None)\n",
}


@pytest.mark.parametrize("kind", HOARD)
def test_memory_outside_the_rlimit_is_refused(sandbox: Sandbox, kind: str) -> None:
    """Local socket pairs held 683-780 MB past a 1 GB RLIMIT_AS; memfds and System V shared memory
    are the same kind of memory. The seccomp filter refuses the calls that make them."""
    needs_seccomp()
    body = HOARD[kind] + "def f(x):\n    try:\n        hoard()\n    except (OSError, AssertionError):\n" \
                         "        return None\n    return x*3+1"
    assert score(sandbox, body)["score"] == 0.0
    assert_host_intact(sandbox)


FILL_PIPES = """
import fcntl, os
report, hold = os.pipe(), os.pipe()
parent = all(os.fork() != 0 for _ in range(3))  # 4 processes: the parent and 3 children
held = 0
try:
    while True:
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, bytes(65536))
        except BlockingIOError:
            pass
except OSError:
    pass
os.write(report[1], b"%d\\n" % held)
if not parent:
    os.read(hold[0], 1)  # keep the pipes until the run ends
got = b""
while got.count(b"\\n") < 4:
    got += os.read(report[0], 4096)
print(got.decode())
"""
PIPE_SOFT_MIB = int(Path("/proc/sys/fs/pipe-user-pages-soft").read_text()) * 4096 >> 20


@pytest.mark.skipif(PIPE_SOFT_MIB == 0, reason="this host sets no per-user pipe buffer limit (pipe-user-pages-soft 0)")
def test_pipe_buffers_are_bounded(sandbox: Sandbox) -> None:
    """4 processes each fill as many 1 MiB pipes as their fds allow (4 x 126 MiB unbounded): the
    kernel's per-uid soft limit, on the run's own uid, holds them to about pipe-user-pages-soft."""
    needs_root_for_rlimit(sandbox)
    result = sandbox.run(FILL_PIPES, "", 10.0)
    held_mib = [int(n) >> 20 for n in result.stdout.split()]
    assert len(held_mib) == 4 and sum(held_mib) <= PIPE_SOFT_MIB + 16, result
    assert_host_intact(sandbox)


def test_endless_output(sandbox: Sandbox) -> None:
    start = time.monotonic()
    body = "import os\ndef f(x):\n    while True:\n        os.write(2, b'x' * 65536)"
    result = score(sandbox, body, timeout_s=5.0)
    assert result["score"] == 0.0 and time.monotonic() - start < 2.0  # the output cap, not the timeout
    assert_host_intact(sandbox)


def test_sleep_forever(sandbox: Sandbox) -> None:
    result = score(sandbox, "import time\ndef f(x):\n    time.sleep(10**6)", timeout_s=0.3)
    assert (result["score"], result["tests_timeout"]) == (0.0, 1.0)
    assert_host_intact(sandbox)


def test_orphan_process_is_killed(sandbox: Sandbox) -> None:
    needs_root_for_rlimit(sandbox)
    # Unique per process and call: `random` is seeded alike by pipeline tests on both xdist workers,
    # so a drawn mark could name the other worker's run of this test (its other sandbox) and see its sleep.
    mark = f"987.{os.getpid()}{secrets.randbelow(10**9)}"
    body = f"import subprocess\ndef f(x):\n    subprocess.Popen(['sleep', '{mark}'], start_new_session=True)\n" \
           "    return None"
    assert score(sandbox, body)["score"] == 0.0
    # Without a slot uid the PID namespace dies with bwrap's monitor, which the kernel completes
    # asynchronously after our wait on the monitor returns: poll, do not sleep a fixed time.
    deadline = time.monotonic() + 5.0
    while (survivors := processes_naming(mark)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert survivors == []
    assert_host_intact(sandbox)


def processes_naming(mark: str) -> list[str]:
    """Live (not zombie) processes whose command line contains `mark`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(entry)
        except OSError:
            continue
    return found


def test_parent_environment_is_hidden(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_TEST_SECRET", "s3cr3t-value")
    body = "import os\ndef f(x):\n    seen = str(dict(os.environ))\n    try:\n" \
           "        seen += open(f'/proc/{os.getppid()}/environ').read()\n    except OSError:\n        pass\n" \
           "    return x*3+1 if 's3cr3t' in seen else None"
    assert score(sandbox, body)["score"] == 0.0
    assert_host_intact(sandbox)


def test_killing_its_parent(sandbox: Sandbox) -> None:
    needs_root_for_rlimit(sandbox)
    body = "import os, signal\ndef f(x):\n    for pid in (os.getppid(), 1):\n        try:\n" \
           "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n" \
           "    os.kill(-1, signal.SIGKILL)"
    assert score(sandbox, body)["score"] == 0.0
    assert_host_intact(sandbox)  # we (the parent) are alive and the sandbox still works


@pytest.mark.parametrize("body", ["import os\nos._exit(0)", "raise SystemExit(0)",
                                  "import sys\nsys.stdout.write('garbage\\n' * 100)\nsys.exit(0)"])
def test_exit_before_tests_run(sandbox: Sandbox, body: str) -> None:
    assert score(sandbox, body + "\ndef f(x):\n    return x*3+1")["score"] == 0.0


def test_forged_reports_are_judged_outside(sandbox: Sandbox) -> None:
    """The program finds the harness's marker and claims every test passed: outputs decide, not claims."""
    body = "import json, os, sys\nspec = sys._getframe(1).f_globals['spec']\nfor _ in spec['tests']:\n" \
           "    os.write(3, (spec['marker'] + json.dumps({'out': 'true', 's': 0}) + '\\n').encode())\n" \
           "def f(x):\n    return None"
    assert score(sandbox, body)["score"] == 0.0


def test_concurrent_correct_programs_never_fail(sandbox: Sandbox) -> None:
    body = "import os\ndef f(x):\n    for _ in range(3):\n        pid = os.fork()\n        if pid == 0:\n" \
           "            os._exit(0)\n        os.waitpid(pid, 0)\n    return x*3+1"
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda _: score(sandbox, body, timeout_s=10.0)["score"], range(40)))
    assert scores == [1.0] * 40
