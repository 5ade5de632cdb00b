"""The code scorer: verdicts per test, judged outside the sandbox; per-test timeouts; crashes fail one test."""

from __future__ import annotations

import json
import re
import time

import pytest

from asyncrl.data.tasks import make_task
from asyncrl.rewards.code_exec import code_score

CALL = json.dumps({"fn_name": "f", "tests": [{"input": [1], "output": 4}, {"input": [2], "output": 7},
                                             {"input": [0], "output": 1}, {"input": [-1], "output": -2}]})


def block(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\nDone."


def test_correct_solution_passes_all() -> None:
    result = code_score(block("def f(x):\n    return x*3+1"), CALL)
    assert result["score"] == 1.0 and result["acc"] == 1.0 and result["tests_total"] == 4.0


def test_partial_solution_scores_fraction() -> None:
    result = code_score(block("def f(x):\n    return 4 if x == 1 else 7 if x == 2 else 99"), CALL)
    assert result["score"] == 0.5 and result["acc"] == 0.0


@pytest.mark.parametrize("code", ["def f(x) return", "def g(x):\n    return 1", "raise SystemExit(0)",
                                  "import os\nos._exit(0)", "def f(x):\n    print('noise')\n    return 0"])
def test_broken_solutions_score_zero(code: str) -> None:
    assert code_score(block(code), CALL)["score"] == 0.0


def test_raw_code_without_block_and_prints_do_not_break_the_report() -> None:
    code = "def f(x):\n    print('#### hello', x)\n    return x*3+1"
    assert code_score(code, CALL)["score"] == 1.0


def test_infinite_loop_fails_its_test_at_its_timeout_and_skips_the_rest() -> None:
    start = time.monotonic()
    code = "def f(x):\n    while x == 2:\n        pass\n    return x*3+1"
    result = code_score(block(code), CALL, timeout_s=0.5)  # test 0 passes, test 1 loops, 2 and 3 not run
    assert time.monotonic() - start < 2.5
    assert (result["score"], result["tests_timeout"]) == (0.25, 1.0)
    assert [result[f"test_pass/{i}"] for i in range(4)] == [1.0, 0.0, 0.0, 0.0]
    assert 0.45 < result["test_s/1"] < 0.5 + 0.5


def test_per_test_timeouts_kill_only_the_slow_test() -> None:
    code = "import time\ndef f(x):\n    time.sleep(0.3 if x == 2 else 0)\n    return x*3+1"
    assert code_score(block(code), CALL, timeout_s=[2.0, 2.0, 2.0, 2.0])["score"] == 1.0
    result = code_score(block(code), CALL, timeout_s=[2.0, 0.1, 2.0, 2.0])
    assert [result[f"test_pass/{i}"] for i in range(4)] == [1.0, 0.0, 0.0, 0.0]


def test_a_crash_fails_only_its_test() -> None:
    code = "import os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x*3+1"
    result = code_score(block(code), CALL)
    assert [result[f"test_pass/{i}"] for i in range(4)] == [1.0, 0.0, 1.0, 1.0]


def test_assert_and_stdio_layouts() -> None:
    asserts = json.dumps(["assert f(2) == 4", "assert f(3) == 9", "assert (1, 4) == g(1)", "assert f(1) < 2"])
    assert code_score(block("def f(x):\n    return x*x\ndef g(x):\n    return (x, 4*x)"), asserts)["score"] == 1.0
    assert code_score(block("def f(x):\n    return 0\ndef g(x):\n    return 1"), asserts)["score"] == 0.25
    stdio = json.dumps({"inputs": ["2 3\n", "10 5\n"], "outputs": ["5\n", "15\n"]})
    code = "a, b = map(int, input().split())\nprint(a + b)"
    assert code_score(block(code), stdio)["score"] == 1.0
    apps_call = json.dumps({"fn_name": "g", "inputs": [[1, 2]], "outputs": [[3]]})
    assert code_score(block("def g(a, b):\n    return a + b"), apps_call)["score"] == 1.0


REFERENCE = {  # template -> (regex over the prompt, solution body using the captured constants)
    "linear": (r"returns x\*(\d+)\+(\d+)", "def f(x):\n    return x*{0}+{1}"),
    "repeat": (r"repeated (\d+) times", "def f(s):\n    return s*{0}"),
    "count_char": (r"letter '(\w)' occurs", "def f(s):\n    return s.count('{0}')"),
    "sum_greater": (r"greater than (-?\d+)", "def f(xs):\n    return sum(x for x in xs if x > {0})"),
    "divisible": (r"divisible by (\d+)", "def f(n):\n    return n % {0} == 0"),
    "replace_char": (r"letter '(\w)' replaced by '(\w)'", "def f(s):\n    return s.replace('{0}', '{1}')"),
}


def test_built_in_code_task_is_solvable_and_checks_answers() -> None:
    rows = make_task("code", 8, seed=0)
    assert len({r.extra_info["template"] for r in rows}) >= 4
    for r in rows:
        pattern, body = REFERENCE[r.extra_info["template"]]
        consts = re.search(pattern, r.messages[0]["content"]).groups()
        assert code_score(block(body.format(*consts)), r.ground_truth)["score"] == 1.0
    assert code_score(block("def f(*a):\n    return None"), rows[0].ground_truth)["score"] < 1.0
