"""The `arithmetic` task: "What is 12+7?" with the integer result as ground truth.

Short, plain-ASCII prompts that a tiny character-level model can learn. Scored by
`asyncrl.rewards` (`arithmetic`: last integer in the response equals the ground truth).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.data.tasks.common import draw_in_split, make_row, task_rng
from asyncrl.types import PromptRow

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def make_arithmetic(
    n: int, *, seed: int = 0, split: str = "train",
    low: int = 0, high: int = 19, ops: Sequence[str] = ("+",),
) -> list[PromptRow]:
    """n prompts `"What is {a}{op}{b}?"` with a, b uniform in [low, high] and op drawn from ops.

    Example: make_arithmetic(1)[0].messages[0]["content"] looks like "What is 48+6?".
    """
    assert all(op in _OPS for op in ops), f"ops must be drawn from {sorted(_OPS)}, got {ops}"
    rng = task_rng("arithmetic", seed, split)

    def draw() -> tuple[int, str, int]:
        return rng.randint(low, high), rng.choice(list(ops)), rng.randint(low, high)

    rows = []
    for i in range(n):
        a, op, b = draw_in_split(draw, lambda t: f"{t[0]}{t[1]}{t[2]}", split)
        rows.append(make_row(
            split=split, index=i, data_source="arithmetic", prompt=f"What is {a}{op}{b}?",
            ground_truth=str(_OPS[op](a, b)), ability="math",
        ))
    return rows
