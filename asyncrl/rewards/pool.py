"""Reward calls in worker processes, so a hung or crashing reward function is killed, not waited on.

`RewardPool(num_workers, timeout_s, custom_function, sandbox)` keeps up to `num_workers` worker processes
(started on first use). `run(calls)` hands each idle worker a chunk of the calls and waits at most
`timeout_s` for each call's answer. `run_batch(call)` runs one TRL-signature function over a batch
(`BatchCall`, see `batch_functions.py`) on a worker the same way: same deadline, same kill.
Past that deadline the worker and every process it started get
SIGKILL (its process group, plus descendants in a session of their own, like the code scorer's
subprocess) and the call is "timeout"; a fresh worker takes the slot on its next call. A worker
that dies mid-call (segfault, `os._exit`, the OOM killer) is replaced and the call retried once;
a second death makes it "error". The result of the call itself comes from `runner.call_reward`,
run inside the worker. The `sandbox` config (where the code scorer runs programs) reaches the
workers as JSON in their `ASYNCRL_SANDBOX` environment variable (`asyncrl.rewards.sandbox.from_env`).

Why processes: a thread cannot be killed, so a hung reward used to keep spinning and, through the
GIL, starve the trainer (an update went from 0.25 s to 84 s). Each worker has its own GIL; the
trainer's threads here only wait on sockets.

Why `subprocess` and not `multiprocessing`: a worker is a fresh interpreter (fork+exec, safe in a
process already running torch or Ray threads) that imports only `asyncrl.rewards`, never torch.
`multiprocessing`'s spawn and forkserver children re-import the parent's `__main__` (the CLI,
Ray's worker script), which imports torch. Reward functions need not pickle: a worker resolves
them itself from the call's data source and `reward.custom_function` (`registry.py`), once per
process. Workers die with their parent: a watchdog thread kills the worker (and its children)
when its parent process is gone, and `close()` or interpreter exit kills them all.

Not here: what a call's value means (`runner.py`), failure budgets (`asyncrl.workers.reward`).
Descendants outside the worker's process group are found through /proc (Linux only).
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, cast

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.registry import RewardFn, known_data_sources, load_custom_function, resolve_reward_fn
from asyncrl.rewards.runner import Outcome, RewardCall, call_reward, failed
from asyncrl.rewards.sandbox import ENV_VAR as SANDBOX_ENV
from asyncrl.rewards.sandbox import to_env
from asyncrl.rewards.trl_values import batch_values, call_trl, function_name

START_TIMEOUT_S = 60.0
"""A worker must import the reward functions and report ready within this (the built-ins take ~0.3 s)."""
_BOOT = "import sys; from asyncrl.rewards.pool import worker_main; worker_main(int(sys.argv[1]), sys.argv[2])"


class BatchCall(NamedTuple):
    """One TRL-signature function, named 'module:fn' (`spec`), called once with a batch's keyword arguments."""

    spec: str
    kwargs: dict[str, Any]


Values = list[float | None]
Reply = Outcome | Values
"""A worker's answer: an Outcome for a RewardCall (or a failed BatchCall), the values of a BatchCall."""
Call = RewardCall | BatchCall


class RewardPool:
    """Thread-safe: `run` may be called from several threads at once; calls share the workers."""

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0, custom_function: str = "",
                 sandbox: SandboxConfig | None = None) -> None:
        assert num_workers >= 1 and timeout_s > 0, (num_workers, timeout_s)
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.custom_function = custom_function
        self.sandbox = sandbox or SandboxConfig()
        self._slots: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(num_workers):
            self._slots.put(None)  # None: no live worker in this slot yet
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.timeout_wait_s = 0.0
        """Worker seconds that timed-out calls cost, summed over the run: each call's deadline, plus
        the start of the worker that replaces the one killed (charged when it starts)."""
        self._timeout_kills = 0
        self._threads = ThreadPoolExecutor(num_workers, thread_name_prefix="reward-pool")
        self._finalizer = weakref.finalize(self, _kill_all, self._live, self._lock)

    def run(self, calls: Sequence[RewardCall]) -> list[Outcome]:
        """The outcome of each call, in order; at most `num_workers` run at once.

        Calls go to the workers in chunks, one message per chunk, each call answered (and
        deadlined) on its own: the same outcomes as one call at a time, without a round trip
        per call (256 arithmetic calls: ~50 ms of IPC per step before)."""
        if not calls:
            return []
        size = -(-len(calls) // self.num_workers)
        chunks: list[list[Call]] = [list(calls[i : i + size]) for i in range(0, len(calls), size)]
        return [cast(Outcome, o) for outcomes in self._threads.map(self._run_chunk, chunks) for o in outcomes]

    def run_one(self, call: RewardCall) -> Outcome:
        """One call on an idle worker (waits for one); never raises for a failing reward."""
        return cast(Outcome, self._run_chunk([call])[0])

    def run_batch(self, call: BatchCall) -> Reply:
        """A TRL function's values over a batch, from an idle worker (waits for one), or the failed
        Outcome that says why not (it raised, returned nonsense, timed out or killed its worker)."""
        return self._run_chunk([call])[0]

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return sorted(w.proc.pid for w in self._live)

    def close(self) -> None:
        """Kill every worker; calls in flight end as "error". Safe to call twice."""
        self._closed = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._finalizer()
        idle = []
        while True:
            try:
                idle.append(self._slots.get_nowait())
            except queue.Empty:
                break
        for worker in idle:
            self._forget(worker)
            self._slots.put(None)  # a call waiting for a slot then fails fast in _start

    def _run_chunk(self, calls: list[Call]) -> list[Reply]:
        """Each call's outcome, the calls sent to one worker at once. Where a call times out, its
        worker is replaced and the rest go on; where the worker dies, that call is retried once
        alone and the rest go on."""
        outcomes: list[Reply] = []
        while calls:
            done, cut = self._attempt_chunk(calls)
            outcomes += done
            calls = calls[len(done):]
            if cut is not None:  # calls[0] ended its worker
                outcomes.append(cut if not isinstance(cut, str) else self._retry(calls[0], cut))
                calls = calls[1:]
        return outcomes

    def _retry(self, call: Call, death: str) -> Reply:
        """A call whose worker died under it, once more on a fresh one (it may not be its fault)."""
        if self._closed:
            return failed("error", death)
        done, cut = self._attempt_chunk([call])
        outcome = done[0] if done else cut
        assert outcome is not None, "a chunk of one call ends in an outcome or a death"
        return failed("error", outcome + " (on the retry too)") if isinstance(outcome, str) else outcome

    def _attempt_chunk(self, calls: list[Call]) -> tuple[list[Reply], Reply | str | None]:
        """The outcomes of the leading calls that completed, and how the next one ended its
        worker (a "timeout" outcome, or the death as text), or None when all completed."""
        worker = self._slots.get()
        done: list[Reply] = []
        try:
            if worker is not None and worker.proc.poll() is not None:
                self._forget(worker)
                worker = None
            if worker is None:
                worker = self._start()
            for outcome in worker.call_many(calls, [deadline_s(c, self.timeout_s) for c in calls]):
                done.append(outcome)
            return done, None
        except TimeoutError:
            return done, self._timed_out(calls[len(done)])
        except _WorkerDied as exc:
            return done, str(exc)
        finally:
            if worker is not None and worker.proc.poll() is not None:
                self._forget(worker)
                worker = None
            self._slots.put(worker)

    def _timed_out(self, call: Call) -> Outcome:
        with self._lock:
            self.timeout_wait_s += deadline_s(call, self.timeout_s)
            self._timeout_kills += 1
        return failed("timeout", f"reward function still running after {deadline_s(call, self.timeout_s):g} s "
                                 f"(reward.timeout_s); its process was killed")

    def _start(self) -> _Worker:
        if self._closed:
            raise _WorkerDied("the reward pool is closed")
        start = time.monotonic()
        worker = _Worker(self.custom_function, self.sandbox)
        with self._lock:
            self._live.add(worker)
        try:
            if self._closed:  # close() ran while it started: its kill missed this one
                raise _WorkerDied("the reward pool is closed")
            worker.wait_ready()
        except _WorkerDied:
            self._forget(worker)
            raise
        with self._lock:
            if self._timeout_kills:  # a replacement for a worker a timeout killed: the hang's cost too
                self._timeout_kills -= 1
                self.timeout_wait_s += time.monotonic() - start
        return worker

    def _forget(self, worker: _Worker | None) -> None:
        """Kill a worker and close its socket (only the thread holding its slot may)."""
        if worker is None:
            return
        with self._lock:
            self._live.discard(worker)
        worker.kill()
        worker.conn.close()


def deadline_s(call: Call, timeout_s: float) -> float:
    """A call's deadline: reward.timeout_s, or longer where the caller declared that the call may
    legitimately take longer (`extra_info["reward_deadline_s"]`: the adaptive code timeouts)."""
    if isinstance(call, BatchCall):
        return timeout_s
    return max(timeout_s, float(call.extra_info.get("reward_deadline_s", 0.0)))


class _WorkerDied(Exception):
    """A worker process exited (or never started); the message says how, in a sentence."""


class _Worker:
    """One worker process and the trainer's end of the socket it answers on."""

    def __init__(self, custom_function: str, sandbox: SandboxConfig) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno()), custom_function],
                pass_fds=(theirs.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                     SANDBOX_ENV: to_env(sandbox)})
        self.conn = Connection(ours.detach())

    def wait_ready(self) -> None:
        if not self.conn.poll(START_TIMEOUT_S):
            raise _WorkerDied(f"reward worker process not ready after {START_TIMEOUT_S:g} s "
                              f"(importing the reward functions)")
        self._recv()  # "ready"

    def call_many(self, calls: list[Call], timeouts_s: list[float]) -> Iterator[Reply]:
        """Each call's answer as it comes, call i given `timeouts_s[i]` from call i-1's answer;
        past it the worker is killed and TimeoutError raised; _WorkerDied if it dies."""
        try:
            self.conn.send(calls)
        except OSError:
            raise _WorkerDied(self._death()) from None
        for timeout_s in timeouts_s:
            if not self.conn.poll(timeout_s):
                self.kill()
                raise TimeoutError
            yield self._recv()

    def _recv(self) -> Reply:
        try:
            reply: Reply = self.conn.recv()
        except (EOFError, OSError):
            raise _WorkerDied(self._death()) from None
        return reply

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # its socket closed but it lives on: make sure
            self.kill()
            code = self.proc.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"reward worker process {how}"

    def kill(self) -> None:
        """SIGKILL the worker and everything it started; reap it. Its socket stays open."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc.wait()


def _kill_all(workers: set[_Worker], lock: threading.Lock) -> None:
    with lock:
        doomed = list(workers)
        workers.clear()
    for worker in doomed:
        worker.kill()


def kill_tree(pid: int) -> None:
    """SIGKILL process `pid`, its process group and all its descendants, wherever their group.

    Frozen first (SIGSTOP), then listed, then killed, so nothing forks in between and no
    descendant is orphaned (an orphan's parent is no longer `pid`'s descendant) before it is listed.
    """
    _signal_group(pid, signal.SIGSTOP)  # its group is its own: workers start a new session
    for victim in _freeze_descendants(pid) | {pid}:
        _signal(victim, signal.SIGKILL)
    _signal_group(pid, signal.SIGKILL)


def _freeze_descendants(pid: int) -> set[int]:
    """SIGSTOP every descendant of `pid`, rescanning until none is left running; their pids."""
    frozen: set[int] = set()
    while True:
        found = _descendants(pid) - frozen
        if not found:
            return frozen
        for child in found:
            _signal(child, signal.SIGSTOP)
        frozen |= found


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` in the process tree (empty without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])  # comm, in parentheses, may hold spaces
            except (OSError, IndexError, ValueError):
                continue  # exited while we looked
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone (or only zombies remain)
        pass


# ---- inside the worker process ----

def worker_main(fd: int, custom_function: str) -> None:
    """A worker's life: load the reward functions, then answer calls on socket `fd` until it closes."""
    parent = os.getppid()
    threading.Thread(target=_die_with_parent, args=(parent,), name="parent-watch", daemon=True).start()
    conn = Connection(fd)
    fns: dict[str, RewardFn] = {}

    def score(call: RewardCall) -> float | dict[str, Any]:
        key = "" if custom_function else call.data_source  # a custom function scores every source
        if key not in fns:
            fns[key] = resolve_reward_fn(call.data_source, custom_function or None)
        return fns[key](*call)

    try:  # import now, not inside the first call's deadline; a failure recurs as each call's error
        resolve_reward_fn("", custom_function) if custom_function else known_data_sources()
    except Exception:  # noqa: BLE001
        pass
    conn.send("ready")
    while True:
        try:
            calls: list[Call] = conn.recv()
        except EOFError:
            return
        for call in calls:  # one answer per call, as each ends
            if isinstance(call, BatchCall):
                conn.send(_batch_values(call))
            else:
                conn.send(call_reward(functools.partial(score, call)))


def _batch_values(call: BatchCall) -> Reply:
    """A TRL function's checked values, or the failed Outcome saying why (in the worker)."""
    name = function_name(call.spec)
    try:
        fn = cast(Callable[..., Any], load_custom_function(call.spec))  # TRL's signature, not RewardFn's
        values = batch_values(name, call_trl(fn, call.kwargs), len(call.kwargs["prompts"]))
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: the worker must survive it
        return failed("error", f"reward function {name} raised {type(exc).__name__}: {exc}",
                      "".join(traceback.format_exception(exc)))
    return failed("error", values) if isinstance(values, str) else values


def _die_with_parent(parent: int) -> None:
    """Once the parent is gone: kill this worker's descendants, then its process group (itself)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    for child in _freeze_descendants(os.getpid()):
        _signal(child, signal.SIGKILL)
    _signal_group(os.getpgid(0), signal.SIGKILL)
