"""The `code` scorer: run the model's Python on each test input in a sandbox; judge outputs outside it.

The code is the last ```python block of the response (else the last ``` block, else the whole
response). It runs in a `Sandbox` (`asyncrl.rewards.sandbox`; backend from `sandbox.backend`, which
`RewardPool` hands to its worker processes). Ground-truth formats (JSON):
- `{"fn_name": "f", "tests": [{"input": [args...], "output": value}, ...]}` (built-in `code` task):
  passes if `f(*input) == output` after a JSON round trip of the result (tuples equal lists);
- `{"asserts": ["assert f(1) == 2", ...]}` or a bare JSON list of such strings: an assert of the
  form `assert L == R` (or `R == L`) with a literal R is split: L is evaluated in the sandbox and
  its JSON-round-tripped value compared with R here. Any other assert (`assert f(1) < 3`,
  `assert f(1) == g(1)`, a non-JSON literal like a set) still runs inside the sandbox, and its
  pass/fail is the harness's report, which the program could forge;
- `{"inputs": [...], "outputs": [...]}` (APPS / verl prime_code layout): without `fn_name` each
  input is fed on stdin and the printed output must match modulo whitespace; with `fn_name`
  inputs are argument lists and an output may be wrapped in a one-element list, as in APPS.

Verdicts are made in this process: expected outputs never enter the sandbox. The sandboxed harness
loads the code afresh for each test, runs it on that test's input and prints one marked JSON line
per test with the output (fd 1 of the program itself goes to /dev/null). A program that exits
early, prints garbage, kills its harness or forges lines only loses tests: a missing or
unparsable report is a failed test.

Per-test timeouts: `extra_info["code_timeouts_s"]` (a list, one per test; the adaptive timeouts
of `reward_scheduler`) or `extra_info["code_timeout_s"]` (the same for every test, default 5 s).
One sandbox run streams all tests; the parent kills it when a test passes its own timeout. A
timed-out (or output-flooding) test fails and so do the tests after it (one slow test must not
cost n timeouts); a crash fails only its test, and a fresh run goes on with the next one. Score =
fraction of tests passed (verl's `continuous=True`), `acc` = 1.0 only if all pass; details
include `test_pass/<i>` and `test_s/<i>` (the parent's measured seconds of test i), which
`RewardWorker` feeds to the adaptive timeout. A sandbox failure (not the program's fault) raises
`SandboxError`: status "error". Keep the sum of a response's timeouts below `reward.timeout_s`.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from typing import Any

from asyncrl.rewards.extract import code_block
from asyncrl.rewards.registry import register
from asyncrl.rewards.sandbox import Sandbox, SandboxError, from_env, sandbox_for

DEFAULT_TIMEOUT_S = 5.0
STARTUP_S = 10.0
"""Time the harness may take to start (before any model code runs; generous for a loaded host)."""
CODE_SOURCES = ("code", "codecontests", "apps", "codeforces", "taco")

# Runs in the sandbox. Reads {"code", "fn_name", "tests": [{"kind", "arg"}], "marker"} from stdin.
# Prints "<marker>"ready"" then one "<marker>{"out": ..., "s": ...}" or {"error": ...} per test.
HARNESS = r'''
import io, json, os, sys, time
spec = json.loads(sys.stdin.read())
report_fd = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
def report(obj):
    os.write(report_fd, (spec["marker"] + json.dumps(obj) + "\n").encode())
def text_io(data=""):
    return io.TextIOWrapper(io.BytesIO(data.encode()), encoding="utf-8", write_through=True)
def run(kind, arg, code):
    ns = {"__name__": "__main__" if kind == "stdio" else "__solution__", "__builtins__": __builtins__}
    if kind == "stdio":
        sys.stdin = text_io(arg)
        try:
            exec(code, ns)
        except SystemExit:
            pass
        sys.stdout.flush()
        return sys.stdout.buffer.getvalue().decode("utf-8", "replace")
    exec(code, ns)
    if kind == "call":
        return ns[spec["fn_name"]](*arg)
    if kind == "expr":
        return eval(arg, ns)
    exec(arg, ns)
    return True
report("ready")
for test in spec["tests"]:
    t0 = time.perf_counter()
    sys.stdout = sys.__stdout__ = text_io()
    try:
        out = json.dumps(run(test["kind"], test["arg"], compile(spec["code"], "<solution>", "exec")))
        rec = {"out": out, "s": time.perf_counter() - t0}
    except BaseException as exc:
        rec = {"error": type(exc).__name__}
    report(rec)
'''


@dataclass(frozen=True)
class Case:
    """One test: what the harness runs (`kind`, `arg`) and what the parent expects."""

    kind: str
    """call (f(*arg)) | stdio (arg on stdin) | expr (evaluate arg) | assert (exec arg in the sandbox)."""
    arg: Any
    expected: Any = None


@dataclass(frozen=True)
class Verdict:
    passed: bool
    seconds: float
    status: str = "ok"
    """ok (ran: passed or wrong) | error (raised) | crash (harness died) | timeout | output_limit | not_run."""


def parse_tests(ground_truth: str) -> tuple[list[Case], str, bool]:
    """The cases of any supported layout, plus fn_name and whether outputs may be wrapped (APPS)."""
    truth = json.loads(ground_truth)
    if isinstance(truth, list):
        truth = {"asserts": truth}
    if "asserts" in truth:
        return [split_assert(a) for a in truth["asserts"]], "", False
    if "tests" in truth:
        return [Case("call", t["input"], t["output"]) for t in truth["tests"]], truth.get("fn_name", "f"), False
    pairs = list(zip(truth["inputs"], truth["outputs"]))
    if truth.get("fn_name"):
        return [Case("call", i, o) for i, o in pairs], truth["fn_name"], True
    return [Case("stdio", str(i), o) for i, o in pairs], "", False


def count_tests(ground_truth: str) -> int:
    """How many tests a ground truth holds (0 if it does not parse)."""
    try:
        return len(parse_tests(ground_truth)[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0


def split_assert(source: str) -> Case:
    """`assert L == R` with a JSON-able literal R (either side) -> expr L, expected R; else the whole assert."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Case("assert", source)
    node = tree.body[0] if len(tree.body) == 1 else None
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
            and isinstance(node.test.ops[0], ast.Eq):
        for expr, lit in ((node.test.left, node.test.comparators[0]), (node.test.comparators[0], node.test.left)):
            expected = _json_literal(lit)
            if expected is not _NO and not isinstance(expr, ast.Constant):
                return Case("expr", ast.get_source_segment(source, expr), expected)
    return Case("assert", source)


_NO = object()


def _json_literal(node: ast.expr) -> Any:
    """The literal's value after a JSON round trip (tuples become lists), or _NO."""
    try:
        return json.loads(json.dumps(ast.literal_eval(node), allow_nan=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO


def judge(case: Case, out: str, wrapped: bool) -> bool:
    """Does the harness's reported output (JSON text) match what `case` expects? Decided here."""
    try:
        got = json.loads(out)
    except (ValueError, TypeError, RecursionError):
        return False
    if case.kind == "stdio":
        return isinstance(got, str) and got.split() == str(case.expected).split()
    if case.kind == "assert":
        return got is True
    return bool(got == case.expected or (wrapped and [got] == case.expected))


def run_tests(code: str, cases: list[Case], fn_name: str, wrapped: bool, timeouts_s: list[float],
              sandbox: Sandbox) -> list[Verdict]:
    """One verdict per case; see the module docstring for what ends a run and what goes on."""
    verdicts: list[Verdict] = []
    while len(verdicts) < len(cases):
        start = len(verdicts)
        verdicts += _one_run(code, cases[start:], fn_name, wrapped, timeouts_s[start:], sandbox)
    return verdicts


def _one_run(code: str, cases: list[Case], fn_name: str, wrapped: bool, timeouts_s: list[float],
             sandbox: Sandbox) -> list[Verdict]:
    """Verdicts of the cases this run reached; at least one (the case it died on fails)."""
    marker = os.urandom(8).hex()
    tests = [{"kind": c.kind, "arg": c.arg} for c in cases]
    spec = {"code": code, "fn_name": fn_name, "marker": marker, "tests": tests}
    result = sandbox.run(HARNESS, json.dumps(spec), STARTUP_S + sum(timeouts_s), marker=marker,
                         step_timeouts_s=timeouts_s)
    if result.status == "sandbox_error":
        raise SandboxError(f"sandbox ({sandbox.name}) failed: {result.stderr.strip()[:300]}")
    records = _records(result.stdout, marker)[:len(cases)]
    verdicts = []
    for k, rec in enumerate(records):
        seconds = result.step_s[k] if k < len(result.step_s) else float(rec.get("s", 0.0))
        if "out" in rec:
            verdicts.append(Verdict(judge(cases[k], str(rec["out"]), wrapped), seconds))
        else:
            verdicts.append(Verdict(False, seconds, "error"))
    if len(verdicts) < len(cases):
        k = len(verdicts)
        ended = result.status if result.status in ("timeout", "output_limit") else "crash"
        verdicts.append(Verdict(False, timeouts_s[k] if ended == "timeout" else 0.0, ended))
        if ended != "crash":  # a slow or flooding program: do not pay for it once per test
            verdicts += [Verdict(False, 0.0, "not_run")] * (len(cases) - k - 1)
    return verdicts


def _records(stdout: str, marker: str) -> list[dict[str, Any]]:
    """The per-test reports after the "ready" line; a malformed report counts as an error."""
    lines = [line[len(marker):] for line in stdout.split("\n") if line.startswith(marker)]
    if not lines or lines[0] != '"ready"':
        return []
    records: list[dict[str, Any]] = []
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        records.append(rec if isinstance(rec, dict) else {"error": "malformed report"})
    return records


def code_score(solution_str: str, ground_truth: str, timeout_s: float | list[float] = DEFAULT_TIMEOUT_S,
               sandbox: Sandbox | None = None) -> dict[str, float]:
    """Example: "```python\\ndef f(x):\\n    return x*3+1\\n```" against f(1)=4, f(2)=7 -> score 1.0."""
    cases, fn_name, wrapped = parse_tests(ground_truth)
    if not cases:
        return {"score": 0.0, "acc": 0.0, "tests_total": 0.0}
    timeouts = list(timeout_s) if isinstance(timeout_s, list) else [float(timeout_s)] * len(cases)
    if len(timeouts) != len(cases):  # a stale list (the ground truth changed): fall back to its longest
        timeouts = [max(timeouts, default=DEFAULT_TIMEOUT_S)] * len(cases)
    verdicts = run_tests(code_block(solution_str), cases, fn_name, wrapped, timeouts,
                         sandbox or sandbox_for(from_env()))
    passed = [v.passed for v in verdicts]
    details = {"score": sum(passed) / len(passed), "acc": float(all(passed)), "tests_passed": float(sum(passed)),
               "tests_total": float(len(passed)), "tests_timeout": float(sum(v.status == "timeout" for v in verdicts)),
               "max_test_s": max(v.seconds for v in verdicts)}
    for i, v in enumerate(verdicts):
        details[f"test_pass/{i}"] = float(v.passed)
        details[f"test_s/{i}"] = v.seconds
    return details


@register(*CODE_SOURCES)
def compute_code(data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for `code` and verl's code data sources (codecontests, apps, codeforces, taco)."""
    info = extra_info or {}
    timeouts = info.get("code_timeouts_s")
    if isinstance(timeouts, (list, tuple)) and timeouts:
        return code_score(solution_str, ground_truth, [float(t) for t in timeouts])
    return code_score(solution_str, ground_truth, float(info.get("code_timeout_s", DEFAULT_TIMEOUT_S)))
