"""The `code` scorer: run the model's Python against unit tests in a subprocess with a timeout.

The code is the last ```python block of the response (else the last ``` block, else the whole
response). One `python -I` subprocess (isolated mode, fresh temp dir as cwd, own process group)
runs all tests of one response and reports which passed. Ground-truth formats (JSON):
- `{"fn_name": "f", "tests": [{"input": [args...], "output": value}, ...]}` (built-in `code` task):
  passes if `f(*input) == output` (after a JSON round trip of the result, so tuples equal lists);
- `{"asserts": ["assert f(1) == 2", ...]}` or a bare JSON list of such strings;
- `{"inputs": [...], "outputs": [...]}` (APPS / verl prime_code layout): without `fn_name` each
  input is fed on stdin and the printed output must match modulo whitespace; with `fn_name`
  inputs are argument lists and an output may be wrapped in a one-element list, as in APPS.

Score = fraction of tests passed (verl's `continuous=True`), `acc` = 1.0 only if all pass. If the
run exceeds its time limit (`extra_info["code_timeout_s"]`, default 5 s, for all tests together)
the process group is killed and `RewardTimeout` is raised, which `runner.call_reward` turns into
score 0 / status "timeout". Keep it below `reward.timeout_s`: past that the whole reward worker
process is killed (this subprocess with it, see `pool.kill_tree`) and replaced. This is not a
sandbox: the code runs as the current user, with network and file access; a real sandbox is a
separate component.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from asyncrl.errors import RewardTimeout
from asyncrl.rewards.extract import code_block
from asyncrl.rewards.registry import register

DEFAULT_TIMEOUT_S = 5.0
CODE_SOURCES = ("code", "codecontests", "apps", "codeforces", "taco")

# Runs in the child. Reads {"code", "mode", "fn_name", "tests", "nonce"} from stdin; prints one
# line "<nonce>{"passed": [...], "times": [...]}" on the real stdout.
_HARNESS = r'''
import contextlib, io, json, sys, time
spec = json.loads(sys.stdin.read())
real_out, sink = sys.stdout, io.StringIO()

def norm(x):
    try:
        return json.loads(json.dumps(x))
    except Exception:
        return x

def load(name):
    ns = {"__name__": name}
    exec(compile(spec["code"], "<solution>", "exec"), ns)
    return ns

def check(test):
    if spec["mode"] == "stdio":
        sys.stdin, buf = io.StringIO(test["input"]), io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                load("__main__")
            except SystemExit:
                pass
        return buf.getvalue().split() == str(test["output"]).split()
    with contextlib.redirect_stdout(sink):
        ns = load("__solution__")
        if spec["mode"] == "assert":
            exec(test["assert"], ns)
            return True
        got = norm(ns[spec["fn_name"]](*test["input"]))
    return got == test["output"] or (spec["wrapped"] and [got] == test["output"])

passed, times = [], []
for test in spec["tests"]:
    t0 = time.perf_counter()
    try:
        ok = bool(check(test))
    except BaseException:
        ok = False
    passed.append(ok)
    times.append(time.perf_counter() - t0)
real_out.write(spec["nonce"] + json.dumps({"passed": passed, "times": times}) + "\n")
real_out.flush()
'''


def parse_tests(ground_truth: str) -> dict[str, Any]:
    """Normalise any supported ground-truth layout to {"mode", "fn_name", "wrapped", "tests"}."""
    truth = json.loads(ground_truth)
    if isinstance(truth, list):
        truth = {"asserts": truth}
    if "asserts" in truth:
        return {"mode": "assert", "fn_name": "", "wrapped": False,
                "tests": [{"assert": a} for a in truth["asserts"]]}
    if "tests" in truth:
        return {"mode": "call", "fn_name": truth.get("fn_name", "f"), "wrapped": False, "tests": truth["tests"]}
    pairs = [{"input": i, "output": o} for i, o in zip(truth["inputs"], truth["outputs"])]
    if truth.get("fn_name"):
        return {"mode": "call", "fn_name": truth["fn_name"], "wrapped": True, "tests": pairs}
    return {"mode": "stdio", "fn_name": "", "wrapped": False, "tests": pairs}


def run_tests(code: str, spec: dict[str, Any], timeout_s: float) -> tuple[list[bool], list[float]]:
    """Run the code against the tests in one subprocess; RewardTimeout past `timeout_s`."""
    nonce = os.urandom(8).hex()
    payload = json.dumps({**spec, "code": code, "nonce": nonce})
    with tempfile.TemporaryDirectory(prefix="asyncrl-code-") as cwd:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _HARNESS], cwd=cwd, text=True, start_new_session=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        try:
            out, _ = proc.communicate(payload, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RewardTimeout(f"code ran past {timeout_s:g} s (extra_info.code_timeout_s)") from None
    for line in out.splitlines():
        if line.startswith(nonce):
            report = json.loads(line[len(nonce):])
            return report["passed"], report["times"]
    return [False] * len(spec["tests"]), []  # the program killed its own interpreter


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def code_score(solution_str: str, ground_truth: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, float]:
    """Example: "```python\\ndef f(x):\\n    return x*3+1\\n```" against f(1)=4, f(2)=7 -> 1.0."""
    spec = parse_tests(ground_truth)
    if not spec["tests"]:
        return {"score": 0.0, "acc": 0.0, "tests_total": 0.0}
    passed, times = run_tests(code_block(solution_str), spec, timeout_s)
    frac = sum(passed) / len(passed)
    return {"score": frac, "acc": float(all(passed)), "tests_passed": float(sum(passed)),
            "tests_total": float(len(passed)), "max_test_s": max(times, default=0.0)}


@register(*CODE_SOURCES)
def compute_code(data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for `code` and verl's code data sources (codecontests, apps, codeforces, taco)."""
    timeout_s = float((extra_info or {}).get("code_timeout_s", DEFAULT_TIMEOUT_S))
    return code_score(solution_str, ground_truth, timeout_s)
