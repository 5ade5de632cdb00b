"""The `countdown` task: combine 3-4 numbers with + - * / to reach a target.

The target is reachable by construction: it is the value of a random expression over all the
numbers (exact integer arithmetic, positive intermediate values, divisions only when exact). The
constructed expression is kept in `extra_info["solution"]`; the scorer does not use it.
Ground truth is JSON `{"target": t, "numbers": [...]}` (the numbers in prompt order).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from asyncrl.data.tasks.common import MAX_TRIES, draw_in_split, make_row, task_rng
from asyncrl.types import PromptRow

PROMPTS = {
    "full": ("Using the numbers {numbers}, write an expression that equals {target}. "
             "You may use + - * / and parentheses, and each number at most once. "
             "Give the expression inside <answer></answer>."),
    "short": "Make {target} from {numbers}.",
}
"""The prompt styles: `full` spells the rules out (for pretrained models); `short` leaves the numbers a
few characters before the answer, for a model that learns from scratch to copy them."""


def make_countdown(
    n: int, *, seed: int = 0, split: str = "train",
    counts: Sequence[int] = (3, 4), max_number: int = 50, max_target: int = 1000, ops: str = "+-*/",
    prompt: str = "full",
) -> list[PromptRow]:
    """n countdown puzzles over `rng.choice(counts)` numbers in [1, max_number], whose constructed
    solutions use only `ops` (a subset of "+-*/"; the `full` prompt still allows all four), worded
    as `PROMPTS[prompt]`."""
    assert ops and set(ops) <= set("+-*/"), f"countdown ops must be some of +-*/, got {ops!r}"
    assert prompt in PROMPTS, f"countdown prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}"
    rng = task_rng("countdown", seed, split)

    def draw() -> tuple[list[int], int, str]:
        return _draw_puzzle(rng, rng.choice(list(counts)), max_number, max_target, ops)

    def key(p: tuple[list[int], int, str]) -> str:
        return f"{sorted(p[0])}={p[1]}"

    rows = []
    for i in range(n):
        numbers, target, solution = draw_in_split(draw, key, split)
        rows.append(make_row(
            split=split, index=i, data_source="countdown",
            prompt=PROMPTS[prompt].format(numbers=numbers, target=target),
            ground_truth=json.dumps({"target": target, "numbers": numbers}),
            ability="math", extra={"solution": solution},
        ))
    return rows


def _draw_puzzle(rng: random.Random, count: int, max_number: int, max_target: int,
                 ops: str) -> tuple[list[int], int, str]:
    for _ in range(MAX_TRIES):
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        built = _build(rng, numbers, ops)
        if built is not None and 1 <= built[0] <= max_target:
            return numbers, built[0], built[1]
    raise ValueError("could not build a countdown puzzle: raise max_target or max_number")


def _build(rng: random.Random, numbers: list[int], ops: str = "+-*/") -> tuple[int, str] | None:
    """Fold the numbers (in a shuffled order) into one expression with `ops`; None if a step is invalid."""
    order = numbers[:]
    rng.shuffle(order)
    value, expr = order[0], str(order[0])
    for x in order[1:]:
        op = rng.choice(ops)
        if rng.random() < 0.5 and op in "+*":
            expr = f"{x}*{_group(expr)}" if op == "*" else f"{x}+{expr}"
        elif op in "*/":
            if op == "/" and value % x:
                return None
            expr = f"{_group(expr)}{op}{x}"
        else:
            expr = f"{expr}{op}{x}"
        value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x}[op]
        if value <= 0:
            return None
    return value, expr


def _group(expr: str) -> str:
    return expr if expr.isdigit() else f"({expr})"
