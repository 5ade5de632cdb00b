"""Scoring responses: rows and response texts in, one `RewardResult` each out, in input order.

`score_batch` turns each (row, text) into a `RewardCall` (verl's compute_score arguments), runs
the calls in a `RewardPool`'s processes and counts each outcome in `RewardStats`. It never raises
for a failing reward: a failure is a score-0 result with its status.

Not here: what a call comes to (`runner.py`), running calls with deadlines (`pool.py`), deciding
that too many failed (`asyncrl.workers.reward`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl.rewards.pool import RewardPool
from asyncrl.rewards.registry import RewardResult
from asyncrl.rewards.runner import RewardCall, RewardStats
from asyncrl.types import PromptRow


def score_batch(rows: Sequence[PromptRow], responses: Sequence[str], *, pool: RewardPool,
                stats: RewardStats | None = None, defaults: Mapping[str, Any] | None = None) -> list[RewardResult]:
    """Score `responses[i]` against `rows[i]` in the pool's processes; results in input order.
    `defaults`: extra_info entries every call gets unless its row sets them (`reward.gsm8k_method`).

    Never raises for a failing reward; takes about ceil(len / pool workers) * timeout_s at worst.
    """
    assert len(rows) == len(responses), (len(rows), len(responses))
    calls = [RewardCall(r.data_source, text, r.ground_truth, {**(defaults or {}), **r.extra_info})
             for r, text in zip(rows, responses)]
    outcomes = pool.run(calls)
    if stats is not None:
        for call, outcome in zip(calls, outcomes):
            stats.record(outcome, call.data_source)
    return [o.result for o in outcomes]


def score_response(row: PromptRow, response_text: str, *, pool: RewardPool,
                   stats: RewardStats | None = None) -> RewardResult:
    """Score one response (see `score_batch`)."""
    return score_batch([row], [response_text], pool=pool, stats=stats)[0]
