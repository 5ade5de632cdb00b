"""scoring: rows and response texts in, one result each out, in input order, counted in the stats.

The pool here calls in this process (`InlinePool`); the real worker processes are tested in
test_pool.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.data.tasks import make_task
from asyncrl.rewards.runner import Outcome, RewardCall, RewardStats, call_reward
from asyncrl.rewards.scoring import score_batch, score_response

ROW = make_task("arithmetic", 1)[0]


class InlinePool:
    """A RewardPool stand-in that calls one function in this process, without deadlines."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def run(self, calls: Sequence[RewardCall]) -> list[Outcome]:
        return [call_reward(lambda c=c: self.fn(*c)) for c in calls]


def test_results_in_input_order_and_counted() -> None:
    values = {"one": 1.0, "half": 0.5, "nan": math.nan}
    pool = InlinePool(lambda ds, text, truth, extra: values[text] if text in values else 1 / 0)
    stats = RewardStats()
    results = score_batch([ROW] * 5, ["half", "boom", "nan", "one", "nan"], pool=pool, stats=stats)
    assert [(r.score, r.status) for r in results] == [(0.5, "ok"), (0.0, "error"), (0.0, "invalid"), (1.0, "ok"),
                                                      (0.0, "invalid")]
    assert stats.metrics() == {"reward/ok_count": 2.0, "reward/errors": 1.0, "reward/timeouts": 0.0,
                               "reward/invalid": 2.0}


def test_score_response_passes_verl_arguments() -> None:
    seen: list[tuple[Any, ...]] = []
    pool = InlinePool(lambda *args: seen.append(args) or 1.0)
    assert score_response(ROW, "text", pool=pool).score == 1.0
    assert seen == [(ROW.data_source, "text", ROW.ground_truth, dict(ROW.extra_info))]


def test_gsm8k_is_strict_by_default_and_the_run_default_yields_to_a_row() -> None:
    from dataclasses import replace

    from asyncrl.rewards.math_rewards import compute_gsm8k

    pool = InlinePool(compute_gsm8k)
    row = replace(ROW, data_source="openai/gsm8k", ground_truth="56", extra_info={})
    strict_row = replace(row, extra_info={"gsm8k_method": "strict"})
    text = "The answer is 56"
    assert [r.score for r in score_batch([row], [text], pool=pool)] == [0.0]  # verl's default: '#### 56' only
    flexible = score_batch([row, strict_row], [text, text], pool=pool, defaults={"gsm8k_method": "flexible"})
    assert [r.score for r in flexible] == [1.0, 0.0]
