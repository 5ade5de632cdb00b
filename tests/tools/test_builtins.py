"""The built-in tools: the calculator is exact and refuses everything but arithmetic; the python
tool runs each call in the sandbox (bwrap when it is installed, and the rlimit fallback)."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox.bwrap import available
from asyncrl.tools.builtins import MAX_RESULT_DIGITS, ToolFailure, calculate
from asyncrl.tools.calls import RAW_ARGUMENT, TRUNCATED, ToolCall, ToolResult
from asyncrl.tools.registry import ToolRegistry

CFG = SandboxConfig(memory_mb=512, tmp_mb=8, max_output_kb=64, max_processes=16)
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(not available(), reason="bwrap not installed")), "rlimit"]


def test_calculator_adds_40_digit_numbers_exactly():
    rng = random.Random(0)
    for _ in range(20):
        a, b = rng.randrange(10**39, 10**40), rng.randrange(10**39, 10**40)
        assert calculate(f"{a} + {b}") == str(a + b)
        assert calculate(f"{a}*{b} - {b}") == str(a * b - b)
    assert calculate("9999999999999999999999999999999999999999 + 1") == "1" + "0" * 40


@pytest.mark.parametrize(("expression", "value"), [
    ("7/2", "3.5"), ("8/2", "4"), (f"{10**30 * 7}/7", str(10**30)), ("7//2", "3"), ("-7 % 3", "2"),
    ("2**10", "1024"), ("-3**2", "-9"), ("(1 + 2) * -3", "-9"), ("2**-2", "0.25"), ("0.5 + 0.25", "0.75"),
    (" 1_000 + 1", "1001"), (f"10**{MAX_RESULT_DIGITS - 1}", "1" + "0" * (MAX_RESULT_DIGITS - 1)),
])
def test_calculator_arithmetic(expression: str, value: str):
    assert calculate(expression) == value


@pytest.mark.parametrize(("expression", "reason"), [
    ("__import__('os').system('true')", "a Call expression"),
    ("x + 1", "the name 'x'"),
    ("(1).__class__", "a Attribute expression"),
    ("'a' * 3", "the constant 'a'"),
    ("True + 1", "the constant True"),
    ("1 < 2", "a Compare expression"),
    ("[1, 2]", "a List expression"),
    ("1 << 2", "a BinOp expression"),
    ("2**10**10", "exponent 10000000000 is larger than 10000"),
    ("9**9**9", "exponent 387420489 is larger than 10000"),
    ("7**5000", f"result longer than {MAX_RESULT_DIGITS} digits"),
    (f"10**{MAX_RESULT_DIGITS - 1} * 10", f"result longer than {MAX_RESULT_DIGITS} digits"),
    (f"{'9' * 600} * {'9' * 600}", f"result longer than {MAX_RESULT_DIGITS} digits"),
    ("1/0", "division by zero"), ("5 % 0", "division by zero"),
    ("1e308 * 10", "not a finite number"), ("2.5**5000", "too large for a float"),
    ("(-8)**0.5", "not a real number"),
    ("1 +", "not an arithmetic expression"), ("1; 2", "not an arithmetic expression"),
    ("-" * 1900 + "1", "nested too deeply"), ("1" * 2001, "longer than 2000 characters"),
])
def test_calculator_refuses_all_but_bounded_arithmetic(expression: str, reason: str):
    with pytest.raises(ToolFailure, match=reason.replace("(", r"\(").replace("*", r"\*")):
        calculate(expression)


@pytest.fixture(params=BACKENDS)
def python_tools(request: pytest.FixtureRequest) -> ToolRegistry:
    return ToolRegistry.builtins(SandboxConfig(**{**CFG.__dict__, "backend": request.param}))


def python(tools: ToolRegistry, code: str, timeout_s: float = 20.0, max_chars: int = 200) -> ToolResult:
    call = ToolCall("python", {RAW_ARGUMENT: code}, code)
    return asyncio.run(tools.run(call, timeout_s=timeout_s, max_chars=max_chars))


def test_python_prints_and_keeps_nothing_between_calls(python_tools: ToolRegistry):
    first = python(python_tools, "x = 6 * 7\nprint(x)\nprint(sum(range(10)))")
    assert (first.text, first.status, first.truncated) == ("42\n45\n", "ok", False)
    assert first.seconds > 0
    second = python(python_tools, "print(x)")
    assert second.status == "error" and second.text.endswith("NameError: name 'x' is not defined\n")


def test_python_infinite_loop_is_killed_at_the_timeout(python_tools: ToolRegistry):
    result = python(python_tools, "print('start', flush=True)\nwhile True: pass", timeout_s=0.5)
    assert result.status == "timeout"
    assert result.text.endswith("timeout: the code ran past 0.5 s and was stopped")


def test_python_flood_is_cut_to_max_chars(python_tools: ToolRegistry):
    result = python(python_tools, "while True: print('y' * 1000)", max_chars=50)
    assert (result.status, result.truncated) == ("ok", True)
    assert result.text == "y" * 50 + TRUNCATED


def test_python_exception_is_its_traceback(python_tools: ToolRegistry):
    result = python(python_tools, "print('before')\ndef f():\n    return 1 / 0\nf()")
    assert result.status == "error"
    assert result.text.startswith("before\n  File \"<program>\", line 4, in <module>")
    assert result.text.endswith("ZeroDivisionError: division by zero\n")
    assert "exit code 3" == python(python_tools, "raise SystemExit(3)").text
