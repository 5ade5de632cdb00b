"""The `code` task: write a small Python function `f`, checked by unit tests.

Each item instantiates one template ("returns x*3+1", "counts the letter 'e'", ...) with random
constants and computes the expected outputs of a few random inputs with a reference lambda.
Ground truth is JSON `{"fn_name": "f", "tests": [{"input": [args...], "output": value}, ...]}`,
the call-based format the `code` scorer runs. The reference solution is not stored.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.data.tasks.common import draw_in_split, make_row, task_rng
from asyncrl.types import PromptRow

SUFFIX = " Answer with a ```python code block."


@dataclass(frozen=True)
class _Template:
    name: str
    text: str  # str.format-ed with the constants
    consts: Callable[[random.Random], dict[str, Any]]
    arg: Callable[[random.Random], Any]
    ref: Callable[[Any, dict[str, Any]], Any]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcde") for _ in range(rng.randint(0, 6)))


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 9) for _ in range(rng.randint(0, 6))]


TEMPLATES = (
    _Template("linear", "Write a Python function f(x) that returns x*{a}+{b}.",
              lambda r: {"a": r.randint(2, 9), "b": r.randint(0, 9)},
              lambda r: r.randint(-20, 20), lambda x, c: x * c["a"] + c["b"]),
    _Template("repeat", "Write a Python function f(s) that returns the string s repeated {k} times.",
              lambda r: {"k": r.randint(2, 5)}, _word, lambda s, c: s * c["k"]),
    _Template("count_char", "Write a Python function f(s) that returns how many times the letter "
              "'{ch}' occurs in the string s.",
              lambda r: {"ch": r.choice("abcde")}, _word, lambda s, c: s.count(c["ch"])),
    _Template("sum_greater", "Write a Python function f(xs) that returns the sum of the numbers in "
              "the list xs that are greater than {t}.",
              lambda r: {"t": r.randint(-3, 3)}, _ints, lambda xs, c: sum(x for x in xs if x > c["t"])),
    _Template("divisible", "Write a Python function f(n) that returns True if n is divisible by {k} "
              "and False otherwise.",
              lambda r: {"k": r.randint(2, 9)}, lambda r: r.randint(0, 100), lambda n, c: n % c["k"] == 0),
    _Template("replace_char", "Write a Python function f(s) that returns s with every letter '{ch}' "
              "replaced by '{to}'.",
              lambda r: dict(zip(("ch", "to"), r.sample(string.ascii_lowercase[:5], 2))), _word,
              lambda s, c: s.replace(c["ch"], c["to"])),
)


def make_code(n: int, *, seed: int = 0, split: str = "train", n_tests: int = 5) -> list[PromptRow]:
    """n function-writing prompts, each with `n_tests` unit tests."""
    rng = task_rng("code", seed, split)

    def draw() -> tuple[_Template, dict[str, Any]]:
        template = rng.choice(TEMPLATES)
        return template, template.consts(rng)

    def key(item: tuple[_Template, dict[str, Any]]) -> str:
        return f"{item[0].name}:{sorted(item[1].items())}"

    rows = []
    for i in range(n):
        template, consts = draw_in_split(draw, key, split)
        args = [template.arg(rng) for _ in range(n_tests)]
        tests = [{"input": [a], "output": template.ref(a, consts)} for a in args]
        rows.append(make_row(
            split=split, index=i, data_source="code", prompt=template.text.format(**consts) + SUFFIX,
            ground_truth=json.dumps({"fn_name": "f", "tests": tests}), ability="code",
            extra={"template": template.name},
        ))
    return rows
