"""math-verify based MATH scorer and the GSM8K `####` scorer, on hand-written responses."""

from __future__ import annotations

import pytest

from asyncrl.rewards.math_rewards import gsm8k_score, math_score
from asyncrl.rewards.registry import resolve_reward_fn


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("so x = \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
        ("The area is $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("I think it is \\boxed{3}. Oh, 42 dollars", "42", 0.0),  # boxed answer is final
        ("we get 17 apples, so the answer is 42", "42", 1.0),  # plain-number fallback
        ("The total is 1,234.", "1234", 1.0),
        ("no idea", "7", 0.0),
        ("", "7", 0.0),
    ],
)
def test_math_score(response: str, truth: str, score: float) -> None:
    assert math_score(response, truth)["score"] == score


@pytest.mark.parametrize(
    ("response", "method", "score"),
    [
        ("3 + 39 = 42\n#### 42", "strict", 1.0),
        ("3 + 39 = 42\n#### 42", "auto", 1.0),
        ("#### 1,042", "strict", 0.0),
        ("The answer is 42", "strict", 0.0),
        ("The answer is 42", "flexible", 1.0),
        ("The answer is 42", "auto", 1.0),
        ("#### 41\nActually 42", "auto", 0.0),  # a #### answer is final under auto
        ("#### 41\nActually 42", "flexible", 1.0),
        ("#### $42.00", "strict", 1.0),
    ],
)
def test_gsm8k_strict_flexible_auto(response: str, method: str, score: float) -> None:
    assert gsm8k_score(response, "42", method)["score"] == score


def test_gsm8k_reports_strict_format() -> None:
    assert gsm8k_score("#### 42", "42")["strict_format"] == 1.0
    assert gsm8k_score("42", "42")["strict_format"] == 0.0


@pytest.mark.parametrize(
    "source",
    ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
     "math_dapo", "numina_olympiads", "aime2024", "aime_2025"],
)
def test_math_data_sources_resolve_to_math_scorer(source: str) -> None:
    fn = resolve_reward_fn(source)
    assert fn(source, "\\boxed{12}", "12", {})["score"] == 1.0


def test_gsm8k_data_source() -> None:
    fn = resolve_reward_fn("openai/gsm8k")
    assert fn("openai/gsm8k", "#### 5", "5", {})["score"] == 1.0
    assert fn("openai/gsm8k", "it is 5", "5", {"gsm8k_method": "strict"})["score"] == 0.0
