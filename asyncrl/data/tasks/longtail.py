"""The `longtail` task: "Repeat the letter a 37 times." with a long-tailed correct length.

The correct response length k is lognormal (median `median`, shape `sigma`), rounded and clamped
to [min_len, max_len]: most answers are short, a few are very long, which is the shape that
makes synchronous RL wait for its slowest response. Used by the long-tail benchmarks. Train and
test are seeded differently but not partitioned (a partition would distort the length law).
"""

from __future__ import annotations

import math

from asyncrl.data.tasks.common import make_row, task_rng
from asyncrl.types import PromptRow


def make_longtail(
    n: int, *, seed: int = 0, split: str = "train",
    median: float = 32.0, sigma: float = 1.0, min_len: int = 1, max_len: int = 512,
    letters: str = "a",
) -> list[PromptRow]:
    """n prompts `"Repeat the letter {c} {k} times."`; ground truth is c * k.

    With the defaults about 0.3% of prompts hit the cap of 512 and half ask for <= 32 letters.
    """
    assert 1 <= min_len <= max_len and median > 0 and sigma >= 0 and letters, \
        "longtail needs 1 <= min_len <= max_len, median > 0, sigma >= 0 and letters"
    rng = task_rng("longtail", seed, split)
    rows = []
    for i in range(n):
        k = round(rng.lognormvariate(math.log(median), sigma))
        k = min(max(k, min_len), max_len)
        c = rng.choice(letters)
        rows.append(make_row(
            split=split, index=i, data_source="longtail", prompt=f"Repeat the letter {c} {k} times.",
            ground_truth=c * k, ability="length", extra={"length": k},
        ))
    return rows
