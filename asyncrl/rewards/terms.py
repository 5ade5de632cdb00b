"""Composable reward terms: a format bonus and DAPO's overlong soft penalty.

Each term is a plain number; `add_terms` adds terms to a `RewardResult`'s score and records each
one in `details` under its name, so a caller can stack (correctness + format + length) without
writing a new reward function. Nothing here decides correctness.
"""

from __future__ import annotations

import dataclasses
import re

from asyncrl.rewards.registry import RewardResult


def format_term(response: str, pattern: str, *, score: float = 1.0) -> float:
    r"""`score` if `re.search(pattern, response, re.DOTALL)` matches, else 0.0.

    Example: format_term("<think>..</think> \boxed{3}", r"^<think>.*</think>.*\\boxed\{") == 1.0
    """
    return score if re.search(pattern, response, re.DOTALL) else 0.0


def length_penalty(n_tokens: int, max_len: int, buffer: int, *, penalty_factor: float = 1.0) -> float:
    """DAPO overlong soft punishment ("Soft Overlong Punishment", Yu et al. 2025, DAPO), in [-penalty_factor, 0].

    0 up to `max_len - buffer` tokens, then linear down to -penalty_factor at `max_len` (and
    beyond). Example: max_len=20, buffer=4: n=16 -> 0.0, n=18 -> -0.5, n=20 -> -1.0.
    """
    assert 0 < buffer <= max_len, (buffer, max_len)
    exceed = n_tokens - (max_len - buffer)
    return -min(max(exceed / buffer, 0.0), 1.0) * penalty_factor


def add_terms(result: RewardResult, terms: dict[str, float]) -> RewardResult:
    """Add each term to the score and record it in details (a failed result stays unchanged)."""
    if result.status != "ok":
        return result
    details = {**result.details, **terms}
    return dataclasses.replace(result, score=result.score + sum(terms.values()), details=details)
