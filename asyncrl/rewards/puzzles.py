"""Scorers for the built-in generated tasks: `arithmetic`, `countdown`, `longtail`.

- arithmetic: 1.0 if the last integer in the response equals the ground truth, else 0.0.
- countdown: the expression is the last `<answer>...</answer>`, else the last non-empty line
  (in both, only the part before a '=' counts). It must contain only digits, + - * / ( ) and
  spaces; it is parsed with `ast` (no `eval`) and computed exactly with fractions. 1.0 if it uses
  each given number at most as often as given and equals the target; a well-formed expression
  that misses (wrong value, reused or foreign numbers, division by zero) gets `format_score`
  (0.1, as in verl's countdown example); anything else 0.0.
- longtail: 1.0 if the stripped response is exactly the expected string; a response made only
  of the right letter but of length n != k gets 0.5 * max(0, 1 - |n - k| / k); otherwise 0.0.
- long_addition: 1.0 if the integer right after the last "Answer:" equals the sum, else 0.0 (a
  tool call and the tool's message may come before it: only the final answer counts).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from asyncrl.rewards.extract import answer_tag, last_integer
from asyncrl.rewards.registry import register

_EXPR_CHARS = re.compile(r"[\d+\-*/()\s]+")
MAX_EXPR_CHARS = 200


@register("arithmetic")
def compute_arithmetic(data_source: str, solution_str: str, ground_truth: str,
                       extra_info: dict[str, Any] | None = None) -> float:
    """Example: ("12+7=19", "19") -> 1.0; ("19 or 20", "19") -> 0.0."""
    return float(last_integer(solution_str) == int(ground_truth))


def countdown_expression(solution_str: str) -> str | None:
    """The candidate expression: last `<answer>` content, else the last non-empty line."""
    text = answer_tag(solution_str)
    if text is None:
        lines = [ln for ln in solution_str.strip().splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    return text.split("=")[0].strip() or None


def _evaluate(node: ast.AST) -> Fraction:
    """Exact value of an arithmetic AST; ValueError for anything but + - * / and int literals."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        ops = {ast.Add: left.__add__, ast.Sub: left.__sub__, ast.Mult: left.__mul__, ast.Div: left.__truediv__}
        return ops[type(node.op)](right)
    raise ValueError(f"not allowed in a countdown expression: {ast.dump(node)}")


def _literals(tree: ast.AST) -> Counter[int]:
    return Counter(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, int))


def countdown_score(solution_str: str, ground_truth: str, format_score: float = 0.1) -> dict[str, float]:
    """Example (target 24, numbers [4, 6, 1]): "<answer>4*6*1</answer>" -> 1.0, "4*6" -> 1.0,
    "4*4+6+1" -> 0.1 (4 used twice), "four times six" -> 0.0."""
    truth = json.loads(ground_truth)
    expr = countdown_expression(solution_str)
    if expr is None or len(expr) > MAX_EXPR_CHARS or not _EXPR_CHARS.fullmatch(expr):
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    try:
        tree = ast.parse(expr, mode="eval")
        value: Fraction | None = _evaluate(tree)
    except (SyntaxError, ValueError):
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    except ZeroDivisionError:
        value = None  # well-formed, just wrong
    numbers_ok = not (_literals(tree) - Counter(truth["numbers"]))
    if numbers_ok and value == truth["target"]:
        return {"score": 1.0, "acc": 1.0, "format": 1.0, "numbers_ok": 1.0}
    return {"score": format_score, "acc": 0.0, "format": 1.0, "numbers_ok": float(numbers_ok)}


@register("countdown")
def compute_countdown(data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for the built-in `countdown` task (ground truth JSON {"target", "numbers"})."""
    return countdown_score(solution_str, ground_truth)


def longtail_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """Example (ground truth "aaaa"): "aaaa" -> 1.0, "aa" -> 0.25, "aaab" -> 0.0."""
    response = solution_str.strip()
    k = len(ground_truth)
    ratio = len(response) / max(k, 1)
    if response == ground_truth:
        return {"score": 1.0, "acc": 1.0, "length_ratio": ratio}
    same_letter = bool(response) and set(response) == set(ground_truth)
    partial = 0.5 * max(0.0, 1.0 - abs(len(response) - k) / max(k, 1)) if same_letter else 0.0
    return {"score": partial, "acc": 0.0, "length_ratio": ratio}


@register("longtail")
def compute_longtail(data_source: str, solution_str: str, ground_truth: str,
                     extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for the built-in `longtail` task."""
    return longtail_score(solution_str, ground_truth)


_FINAL_ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def long_addition_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """Example (ground truth "579"): "Answer: 579" -> 1.0; "<tool_call>calculator 123+456</tool_call>579Answer: 579"
    -> 1.0 (called_tool 1.0); "579" -> 0.0 (no final answer); "Answer: 578" -> 0.0."""
    found = _FINAL_ANSWER.findall(solution_str)
    correct = bool(found) and int(found[-1]) == int(ground_truth)
    return {"score": float(correct), "acc": float(correct), "called_tool": float("<tool_call>" in solution_str)}


@register("long_addition")
def compute_long_addition(data_source: str, solution_str: str, ground_truth: str,
                          extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for the built-in `long_addition` task (the tiny-tools model's)."""
    return long_addition_score(solution_str, ground_truth)
