"""Rule-based rewards: a registry keyed by `data_source`, built-in scorers, a process pool to run them.

Typical use:
    pool = RewardPool(num_workers=2, timeout_s=10.0, custom_function=cfg.custom_function)
    result = score_response(row, text, pool=pool, stats=stats)  # status ok|error|timeout|invalid
    pool.close()
"""

from asyncrl.rewards.pool import RewardPool
from asyncrl.rewards.registry import (
    RewardFn,
    RewardResult,
    compute_score,
    known_data_sources,
    register,
    resolve_reward_fn,
)
from asyncrl.rewards.runner import RewardStats, check_signature
from asyncrl.rewards.scoring import score_batch, score_response
from asyncrl.rewards.terms import add_terms, format_term, length_penalty

__all__ = [
    "RewardFn", "RewardPool", "RewardResult", "RewardStats", "add_terms", "check_signature", "compute_score",
    "format_term", "known_data_sources", "length_penalty", "register", "resolve_reward_fn", "score_batch",
    "score_response",
]
