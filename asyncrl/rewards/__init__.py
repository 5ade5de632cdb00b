"""Rule-based rewards: a registry keyed by `data_source`, built-in scorers, a safe runner.

Typical use:
    fn = resolve_reward_fn(row.data_source, cfg.custom_function)
    result = score_response(row, text, reward_fn=fn, timeout_s=10.0, stats=stats)
"""

from asyncrl.rewards.registry import (
    RewardFn,
    RewardResult,
    compute_score,
    known_data_sources,
    register,
    resolve_reward_fn,
)
from asyncrl.rewards.runner import RewardStats, score_batch, score_response
from asyncrl.rewards.terms import add_terms, format_term, length_penalty

__all__ = [
    "RewardFn", "RewardResult", "RewardStats", "add_terms", "compute_score", "format_term",
    "known_data_sources", "length_penalty", "register", "resolve_reward_fn", "score_batch",
    "score_response",
]
