"""Math answer scorers: math-verify for LaTeX/boxed answers, and GSM8K's `#### answer` rule.

`math_score`: the gold answer is parsed as `\\boxed{ground_truth}`; the response (its last
`MAX_CHARS` characters) by math-verify, which prefers the last `\\boxed{}` and otherwise finds
LaTeX or plain expressions. If math-verify does not confirm the answer and the response has no
`\\boxed{}`, the last plain number of the response is compared numerically with the gold answer
(so "... the answer is 42" scores even when math-verify picked another span). A `\\boxed{}`
answer is final: a wrong boxed answer is not rescued by a number after it.

`gsm8k_score`: verl's rule. "strict" (the default, as verl's) takes the last `#### <number>` (the
GSM8K format); "flexible" the last number anywhere; "auto" uses `####` when the response has one
and the last number otherwise. `reward.gsm8k_method` picks it for a run, a row's
`extra_info["gsm8k_method"]` for that row. Numbers compare after removing
commas and `$`, numerically (so "72.0" == "72").

math-verify's own signal-based timeouts only work in the main thread, so they are off here:
the reward process pool (`pool.py`) bounds the time instead. Scores are 1.0 / 0.0 (verl's math_dapo uses
+1 / -1; shift it with `terms.add_terms` if you want that).
"""

from __future__ import annotations

from typing import Any

import math_verify
import math_verify.grader
import math_verify.parser
from math_verify import parse, verify

from asyncrl.rewards.extract import first_number, last_boxed, last_number, to_number
from asyncrl.rewards.registry import register

MAX_CHARS = 2000
# We bound run time in runner.py; tell math-verify not to warn that its own timeout is off.
math_verify.parser.TIMEOUT_WARNING_SHOWN = True
math_verify.grader.TIMEOUT_WARNING_SHOWN = True

MATH_SOURCES = (
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
    "math_dapo", "math", "math_dapo_reasoning",
    "numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
    "numina_cn_k12", "numina_olympiads", "hiyouga/geometry3k",
)


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Whether two strings are the same plain number (relative tolerance 1e-9)."""
    x, y = to_number(a or ""), to_number(b or "")
    return x is not None and y is not None and abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))


def math_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """1.0 if the response's final answer equals `ground_truth` mathematically, else 0.0.

    Example: math_score("so x = \\boxed{\\frac{1}{2}}", "0.5")["score"] == 1.0
    """
    tail = solution_str[-MAX_CHARS:]
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=None)
    pred = parse(tail, parsing_timeout=None)
    correct = bool(gold and pred and verify(gold, pred, timeout_seconds=None))
    boxed = last_boxed(tail) is not None
    if not correct and not boxed:
        correct = numbers_equal(last_number(tail), ground_truth)
    return {"score": float(correct), "acc": float(correct), "boxed": float(boxed)}


def gsm8k_score(solution_str: str, ground_truth: str, method: str = "strict") -> dict[str, float]:
    """GSM8K: compare the `#### n` answer ("strict"), the last number ("flexible"), or either ("auto").

    Example: gsm8k_score("3 + 4 = 7\\n#### 7", "7")["score"] == 1.0; "The answer is 7" scores 1.0
    under "auto"/"flexible" and 0.0 under "strict".
    """
    assert method in ("strict", "flexible", "auto"), method
    tail = solution_str[-MAX_CHARS:]
    marked = tail.rsplit("####", 1)[1] if "####" in tail else None
    strict = first_number(marked.split("\n")[0]) if marked is not None else None
    if method == "strict" or (method == "auto" and marked is not None):
        answer = strict
    else:
        answer = last_number(tail)
    correct = numbers_equal(answer, ground_truth)
    return {"score": float(correct), "acc": float(correct), "strict_format": float(strict is not None)}


@register(*MATH_SOURCES)
@register("aime", prefix=True)
def compute_math(data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for MATH-style data sources (see MATH_SOURCES and the `aime*` prefix)."""
    return math_score(solution_str, ground_truth)


@register("openai/gsm8k", "gsm8k")
def compute_gsm8k(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None) -> dict[str, float]:
    """Registered for GSM8K; `extra_info["gsm8k_method"]` may pick "flexible" or "auto" (default "strict")."""
    return gsm8k_score(solution_str, ground_truth, (extra_info or {}).get("gsm8k_method", "strict"))
