"""Scorers for the built-in tasks: arithmetic, countdown, longtail, long_addition."""

from __future__ import annotations

import json

import pytest

from asyncrl.rewards.puzzles import compute_arithmetic, countdown_score, long_addition_score, longtail_score

TRUTH = json.dumps({"target": 24, "numbers": [4, 6, 1]})


@pytest.mark.parametrize(
    ("response", "score"),
    [("5", 1.0), ("2+3=5", 1.0), ("The answer is 5.", 1.0), ("5 or 6", 0.0), ("five", 0.0), ("-5", 0.0)],
)
def test_arithmetic_last_integer(response: str, score: float) -> None:
    assert compute_arithmetic("arithmetic", response, "5", {}) == score


def test_arithmetic_negative_answers() -> None:
    assert compute_arithmetic("arithmetic", "3-8=-5", "-5", {}) == 1.0
    assert compute_arithmetic("arithmetic", "12-4", "4", {}) == 1.0  # '-' after a digit is minus


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("<answer>4*6*1</answer>", 1.0),
        ("<answer>(4*6)/1</answer>", 1.0),
        ("Let me think.\n4*6", 1.0),  # last line, no tags
        ("<answer>4 * 6 = 24</answer>", 1.0),  # only the part before '=' counts
        ("<answer>4*6+1</answer>", 0.1),  # well-formed, wrong value
        ("<answer>4*4+6+1+1</answer>", 0.1),  # 4 and 1 reused
        ("<answer>24</answer>", 0.1),  # foreign number
        ("<answer>4/(1-1)</answer>", 0.1),  # division by zero
        ("<answer>4**6</answer>", 0.0),  # not allowed syntax
        ("<answer>__import__('os')</answer>", 0.0),
        ("<answer>(4*6</answer>", 0.0),
        ("four times six", 0.0),
        ("", 0.0),
    ],
)
def test_countdown(response: str, score: float) -> None:
    assert countdown_score(response, TRUTH)["score"] == score


def test_countdown_reports_number_misuse() -> None:
    assert countdown_score("<answer>4*4</answer>", TRUTH)["numbers_ok"] == 0.0
    assert countdown_score("<answer>4+6</answer>", TRUTH)["numbers_ok"] == 1.0


@pytest.mark.parametrize(
    ("response", "score"),
    [("aaaa", 1.0), ("  aaaa\n", 1.0), ("aa", 0.25), ("aaaaaa", 0.25), ("aaaaaaaaaa", 0.0), ("aaab", 0.0), ("", 0.0)],
)
def test_longtail(response: str, score: float) -> None:
    assert longtail_score(response, "aaaa")["score"] == pytest.approx(score, rel=0, abs=1e-12)


@pytest.mark.parametrize(
    ("response", "score", "called"),
    [("Answer: 1111111", 1.0, 0.0),
     ("<tool_call>calculator 123456+987655</tool_call>1111111Answer: 1111111", 1.0, 1.0),  # as decoded for the reward
     ("<tool_call>calculator 123456+987655</tool_call>1111111Answer: 1111112", 0.0, 1.0),  # copied wrongly
     ("<tool_call>calculator 123456+987655</tool_call>", 0.0, 1.0),  # no tool answered, no final answer
     ("1111111", 0.0, 0.0), ("Answer: 11111110", 0.0, 0.0), ("Answer: 1111111 Answer: 2", 0.0, 0.0)],
)
def test_long_addition_reads_the_last_final_answer(response: str, score: float, called: float) -> None:
    result = long_addition_score(response, "1111111")
    assert result == {"score": score, "acc": score, "called_tool": called}
