"""RewardPool: every way a reward function can fail ends as a status, and the pool keeps scoring.

The reward functions under test live in one file written to a temporary directory and are
picked by the response text ("raise", "hang", ...), as a user's `reward.custom_function`
("file.py:fn") would be. Worker processes are real; deadlines are short (0.5 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.rewards.pool import RewardPool
from asyncrl.rewards.runner import RewardCall

TIMEOUT_S = 0.5

REWARDS = '''
import math, os, subprocess, sys, time

def reward(data_source, solution_str, ground_truth, extra_info):
    kind = solution_str
    if "pidfile" in extra_info:
        child = ""
        if kind in ("spawn", "spawn_session"):
            child = subprocess.Popen(["sleep", "1000"], start_new_session=kind == "spawn_session").pid
        with open(extra_info["pidfile"], "w") as f:
            f.write(f"{os.getpid()} {child}")
    if kind == "ok":
        return {"score": float(ground_truth), "acc": 1.0, "pid": os.getpid()}
    if kind == "raise":
        return 1 / 0
    if kind == "nan":
        return math.nan
    if kind == "str":
        return "1.0"
    if kind == "exit":
        sys.exit(3)
    if kind == "os_exit":
        os._exit(3)
    if kind == "segfault":
        import ctypes
        ctypes.string_at(0)
    if kind == "crash_once":
        if not os.path.exists(extra_info["marker"]):
            open(extra_info["marker"], "w").close()
            os._exit(1)
        return 1.0
    if kind == "busy":
        while True:
            pass
    time.sleep(1000)  # hang, spawn, spawn_session


def two_args(solution_str, ground_truth):
    return 1.0
'''


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "my_reward.py"
    path.write_text(REWARDS)
    return path


@pytest.fixture
def pool(rewards_file: Path) -> Iterator[RewardPool]:
    pool = RewardPool(num_workers=2, timeout_s=TIMEOUT_S, custom_function=f"{rewards_file}:reward")
    yield pool
    pool.close()


def call(kind: str, truth: str = "1.0", **extra: str) -> RewardCall:
    return RewardCall("my_source", kind, truth, dict(extra))


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (killed, not yet reaped by init) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def all_dead(pids: list[int], within_s: float = 5.0) -> bool:
    """Whether every process is gone within `within_s` (a SIGKILLed process takes a moment to exit)."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(alive(pid) for pid in pids)


def pids_in(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def assert_scores_ok(pool: RewardPool) -> None:
    outcomes = pool.run([call("ok", "0.25"), call("ok", "0.75")])
    assert [(o.result.status, o.result.score) for o in outcomes] == [("ok", 0.25), ("ok", 0.75)]


def test_ok_results_in_order_with_details(pool: RewardPool) -> None:
    outcomes = pool.run([call("ok", str(i)) for i in range(5)])
    assert [o.result.score for o in outcomes] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert outcomes[0].result.details["acc"] == 1.0 and outcomes[0].result.details["pid"] != os.getpid()


def test_raising_reward_is_error_with_location(pool: RewardPool) -> None:
    outcome = pool.run_one(call("raise"))
    assert (outcome.result.score, outcome.result.status) == (0.0, "error")
    assert outcome.result.error.startswith("ZeroDivisionError: division by zero in my_reward.py:")
    assert "Traceback" in outcome.trace


@pytest.mark.parametrize("kind", ["nan", "str"])
def test_nonsense_values_are_invalid(pool: RewardPool, kind: str) -> None:
    assert pool.run_one(call(kind)).result.status == "invalid"


def test_wrong_signature_is_error(rewards_file: Path) -> None:
    pool = RewardPool(1, TIMEOUT_S, f"{rewards_file}:two_args")
    try:
        outcome = pool.run_one(call("ok"))
    finally:
        pool.close()
    assert outcome.result.status == "error" and outcome.result.error.startswith("TypeError")


def test_sys_exit_is_error_and_worker_survives(pool: RewardPool, tmp_path: Path) -> None:
    outcome = pool.run_one(call("exit", pidfile=str(tmp_path / "pid")))
    assert outcome.result.status == "error" and outcome.result.error.startswith("SystemExit: 3")
    worker = pids_in(tmp_path / "pid")[0]
    assert alive(worker) and worker in pool.pids()


@pytest.mark.parametrize(("kind", "death"), [("os_exit", "exited with code 3"), ("segfault", "was killed by SIGSEGV")])
def test_crash_is_error_and_worker_replaced(pool: RewardPool, tmp_path: Path, kind: str, death: str) -> None:
    outcome = pool.run_one(call(kind, pidfile=str(tmp_path / "pid")))
    assert outcome.result.status == "error"
    assert outcome.result.error == f"reward worker process {death} (on the retry too)"
    assert all_dead(pids_in(tmp_path / "pid"))
    assert_scores_ok(pool)


def test_one_crash_is_retried(pool: RewardPool, tmp_path: Path) -> None:
    outcome = pool.run_one(call("crash_once", marker=str(tmp_path / "marker")))
    assert (outcome.result.status, outcome.result.score) == ("ok", 1.0)


@pytest.mark.parametrize("kind", ["hang", "busy", "spawn", "spawn_session"])
def test_timeout_kills_the_worker_and_its_children(pool: RewardPool, tmp_path: Path, kind: str) -> None:
    start = time.monotonic()
    outcome = pool.run_one(call(kind, pidfile=str(tmp_path / "pid")))
    assert time.monotonic() - start < 5.0
    assert (outcome.result.score, outcome.result.status) == (0.0, "timeout")
    assert "reward.timeout_s" in outcome.result.error
    assert all_dead(pids_in(tmp_path / "pid"))
    assert_scores_ok(pool)


def test_concurrent_callers_share_the_workers(pool: RewardPool) -> None:
    results: dict[int, list[tuple[str, float]]] = {}

    def score(i: int) -> None:
        outcomes = pool.run([call("ok", str(i)), call("hang" if i == 0 else "ok", str(i))])
        results[i] = [(o.result.status, o.result.score) for o in outcomes]

    threads = [threading.Thread(target=score, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results[0] == [("ok", 0.0), ("timeout", 0.0)]
    assert all(results[i] == [("ok", float(i))] * 2 for i in (1, 2, 3))
    assert len(pool.pids()) <= 2


def test_a_chunk_keeps_each_calls_outcome_and_deadline(pool: RewardPool, tmp_path: Path) -> None:
    """`run` sends each worker a chunk; a hang or crash inside one ends only that call, the calls
    after it go on (on a fresh worker), and each call keeps its own deadline."""
    kinds = ["ok", "hang", "ok", "ok", "crash_once", "ok", "os_exit", "ok"]
    calls = [call(k, str(i), marker=str(tmp_path / "marker")) for i, k in enumerate(kinds)]
    start = time.monotonic()
    outcomes = pool.run(calls)
    assert time.monotonic() - start < 4 * TIMEOUT_S + 3.0  # one deadline, not one per later call
    got = [(o.result.status, o.result.score) for o in outcomes]
    assert got == [("ok", 0.0), ("timeout", 0.0), ("ok", 2.0), ("ok", 3.0), ("ok", 1.0), ("ok", 5.0),
                   ("error", 0.0), ("ok", 7.0)]
    assert outcomes[6].result.error == "reward worker process exited with code 3 (on the retry too)"
    assert len({o.result.details["pid"] for o in outcomes if "pid" in o.result.details}) >= 3  # replaced workers
    assert len(pool.pids()) <= 2


def test_close_kills_workers(rewards_file: Path) -> None:
    pool = RewardPool(2, TIMEOUT_S, f"{rewards_file}:reward")
    pool.run([call("ok"), call("ok")])
    pids = pool.pids()
    assert len(pids) == 2
    pool.close()
    assert pool.pids() == [] and all_dead(pids)


def test_workers_die_with_their_parent(rewards_file: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        from asyncrl.rewards.pool import RewardPool
        from asyncrl.rewards.runner import RewardCall
        pool = RewardPool(2, 5.0, {str(rewards_file) + ':reward'!r})
        pool.run([RewardCall("s", "ok", "1", {{}})] * 2)
        print(*pool.pids(), flush=True)
        os._exit(0)  # no close(), no atexit: the workers must notice on their own
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2 and all_dead(pids)


def test_builtin_scorers_resolve_in_the_worker() -> None:
    from asyncrl.data.tasks import make_task

    row = make_task("arithmetic", 1)[0]
    code = make_task("code", 1)[0]
    pool = RewardPool(1, 10.0)
    try:
        good, loop = pool.run([
            RewardCall(row.data_source, f"It is {row.ground_truth}", row.ground_truth, dict(row.extra_info)),
            RewardCall(code.data_source, "```python\nwhile True:\n    pass\n```", code.ground_truth,
                       {**code.extra_info, "code_timeout_s": 0.5}),
        ])
    finally:
        pool.close()
    assert (good.result.status, good.result.score) == ("ok", 1.0)
    # a looping program fails its test at the per-test timeout; the reward call itself is fine
    assert (loop.result.status, loop.result.score, loop.result.details["tests_timeout"]) == ("ok", 0.0, 1.0)


def test_a_call_may_declare_a_longer_deadline():
    from asyncrl.rewards.pool import deadline_s

    call = RewardCall("x", "", "", {"reward_deadline_s": 42.0})
    assert deadline_s(call, 10.0) == 42.0
    assert deadline_s(RewardCall("x", "", "", {}), 10.0) == 10.0
    assert deadline_s(RewardCall("x", "", "", {"reward_deadline_s": 3.0}), 10.0) == 10.0
