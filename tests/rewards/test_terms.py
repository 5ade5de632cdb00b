"""Format and DAPO overlong terms, and composing terms into a result."""

from __future__ import annotations

import pytest

from asyncrl.rewards.registry import RewardResult
from asyncrl.rewards.terms import add_terms, format_term, length_penalty


def test_format_term() -> None:
    pattern = r"^<think>.*</think>.*\\boxed\{"
    assert format_term("<think>a\nb</think> so \\boxed{3}", pattern) == 1.0
    assert format_term("so \\boxed{3}", pattern) == 0.0
    assert format_term("<think></think>\\boxed{1}", pattern, score=0.2) == 0.2


@pytest.mark.parametrize(("n", "expected"), [(0, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (25, -1.0)])
def test_length_penalty_dapo(n: int, expected: float) -> None:
    assert length_penalty(n, max_len=20, buffer=4) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_length_penalty_factor() -> None:
    assert length_penalty(18, 20, 4, penalty_factor=0.5) == pytest.approx(-0.25, rel=1e-12, abs=1e-12)


def test_add_terms_records_details_and_skips_failures() -> None:
    result = add_terms(RewardResult(1.0, {"acc": 1.0}), {"format": 0.1, "overlong": -0.5})
    assert result.score == pytest.approx(0.6, rel=1e-12, abs=1e-12)
    assert result.details == {"acc": 1.0, "format": 0.1, "overlong": -0.5}
    failed = RewardResult(0.0, status="error", error="boom")
    assert add_terms(failed, {"format": 1.0}) == failed
