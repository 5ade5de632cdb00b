"""The built-in tools: a calculator and a Python interpreter.

- `calculate(expression)`: arithmetic on numbers with + - * / // % ** and parentheses, parsed with
  `ast` and evaluated node by node (never `eval`). Integers stay exact at any size up to
  `MAX_RESULT_DIGITS` digits (the tool task adds numbers too long for a tiny model); `/` of two
  integers that divide evenly stays an integer, else it is a float. Refused, with a one-line
  reason: names, calls, attributes, strings, comparisons, a result past `MAX_RESULT_DIGITS`
  digits, an exponent past `MAX_EXPONENT`, division by zero, a non-finite float.
- `run_python(code, sandbox, timeout_s)`: the code runs as a fresh program in the sandbox
  (`asyncrl.rewards.sandbox`: bwrap when installed, else the rlimit fallback, with
  `sandbox.*`'s limits), stateless per call; the answer is its stdout, followed by the
  traceback when it raised. Nothing is printed back for it: a value must be `print`ed.

Both raise `ToolFailure` for what the model did wrong and `ToolTimeout` past their deadline;
the registry turns each into a `ToolResult`. Not here: the schemas and the registry
(`asyncrl.tools.registry`).
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable

from asyncrl.rewards.sandbox import Sandbox

MAX_EXPRESSION_CHARS = 2000
MAX_RESULT_DIGITS = 1000
"""Largest integer result (and intermediate) in decimal digits; well under Python's 4300-digit str limit."""
MAX_EXPONENT = 10_000
_MAX_BITS = math.ceil(MAX_RESULT_DIGITS * math.log2(10))
_LIMIT = 10 ** MAX_RESULT_DIGITS

Number = int | float


class ToolFailure(Exception):
    """The tool refused or failed its input; the message is what the model reads (status "error")."""


class ToolTimeout(Exception):
    """The tool ran past its deadline and was stopped (status "timeout")."""


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text.

    Example: calculate("123456789012345678901234567890 + 987654321098765432109876543210")
    -> "1111111110111111111011111111100"; calculate("7/2") -> "3.5"; calculate("8/2") -> "4".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolFailure(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with warnings.catch_warnings():  # "invalid decimal literal" and kin: the model's text, not ours to print
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolFailure(f"not an arithmetic expression ({type(exc).__name__})") from None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        raise ToolFailure("division by zero") from None
    except OverflowError:
        raise ToolFailure("result too large for a float") from None
    except RecursionError:
        raise ToolFailure("expression nested too deeply") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolFailure("result is not a finite number")
    return repr(value)


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _bounded(_apply(node.op, left, right))
    raise ToolFailure(f"not allowed in a calculation: {_describe(node)} (only numbers and + - * / // % **)")


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise ToolFailure(f"exponent {right!r} is larger than {MAX_EXPONENT}")
        if isinstance(left, int) and isinstance(right, int) and right > 0 and \
                (abs(left).bit_length() - 1) * right > _MAX_BITS:
            raise ToolFailure(f"result longer than {MAX_RESULT_DIGITS} digits")
    if isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int) and \
            abs(left).bit_length() + abs(right).bit_length() > _MAX_BITS + 1:
        raise ToolFailure(f"result longer than {MAX_RESULT_DIGITS} digits")
    if isinstance(op, ast.Div) and isinstance(left, int) and isinstance(right, int) and right and left % right == 0:
        return left // right  # exact, at any size
    return _BINARY[type(op)](left, right)


def _bounded(value: Number) -> Number:
    if isinstance(value, complex):  # a negative number to a fractional power
        raise ToolFailure("result is not a real number")
    if isinstance(value, int) and value.bit_length() > _MAX_BITS - 4 and abs(value) >= _LIMIT:
        raise ToolFailure(f"result longer than {MAX_RESULT_DIGITS} digits")
    return value


def _describe(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"[:80]
    return f"a {type(node).__name__} expression"


def run_python(code: str, sandbox: Sandbox, timeout_s: float) -> str:
    """Run `code` as a new program in `sandbox`; its stdout (and traceback), or a failure."""
    result = sandbox.run(code, "", timeout_s)
    if result.status == "timeout":
        raise ToolTimeout(_after(result.stdout, f"timeout: the code ran past {timeout_s:g} s and was stopped"))
    if result.status == "output_limit":
        return result.stdout  # the flood is cut to max_chars by the registry
    if result.status == "sandbox_error":
        raise RuntimeError(f"the sandbox ({sandbox.name}) failed: {result.stderr.strip()[:200]}")
    if result.status == "killed":
        raise ToolFailure(_after(result.stdout, f"killed by signal {-(result.exit_code or 0)} (a memory or CPU limit)"))
    if result.exit_code:
        raise ToolFailure(_after(result.stdout, _traceback(result.stderr) or f"exit code {result.exit_code}"))
    return result.stdout


def _traceback(stderr: str) -> str:
    """The program's own part of a traceback (the sandbox's start-up frame dropped)."""
    start = stderr.find('  File "<program>"')
    return stderr[start:] if start >= 0 else stderr


def _after(stdout: str, message: str) -> str:
    """What the program printed, then why it ended, on a line of its own."""
    return stdout + ("\n" if stdout and not stdout.endswith("\n") else "") + message
