"""The `long_addition` task: "What is 48213907+5120644?" with operands too long to add by heart.

Each operand has `min_digits`..`max_digits` digits (no leading zero), drawn per operand, so the
tiny models cannot add them reliably by themselves: calling the calculator and copying its
result is the way to a high score (the `tiny-tools` model's task, `asyncrl.models.tiny_tools`).
Scored by `asyncrl.rewards` (`long_addition`: the integer after the response's last "Answer:"
equals the sum exactly). Train and test items are disjoint (`common.in_split` on "a+b").
"""

from __future__ import annotations

from random import Random

from asyncrl.data.tasks.common import draw_in_split, make_row, task_rng
from asyncrl.types import PromptRow

ANSWER_PREFIX = "Answer: "
"""What precedes the final answer in a response (the scorer reads the integer after the last one)."""


def make_long_addition(
    n: int, *, seed: int = 0, split: str = "train", min_digits: int = 6, max_digits: int = 10,
) -> list[PromptRow]:
    """n prompts `"What is {a}+{b}?"`, each operand of a uniform number of digits in [min_digits, max_digits].

    Example: make_long_addition(1)[0].messages[0]["content"] looks like "What is 3870412+958201?"
    and its ground truth is the sum, "4828613".
    """
    assert 1 <= min_digits <= max_digits, f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}"
    rng = task_rng("long_addition", seed, split)

    def draw() -> tuple[int, int]:
        return _operand(rng, min_digits, max_digits), _operand(rng, min_digits, max_digits)

    rows = []
    for i in range(n):
        a, b = draw_in_split(draw, lambda t: f"{t[0]}+{t[1]}", split)
        rows.append(make_row(
            split=split, index=i, data_source="long_addition", prompt=f"What is {a}+{b}?",
            ground_truth=str(a + b), ability="math",
        ))
    return rows


def _operand(rng: Random, min_digits: int, max_digits: int) -> int:
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1)
