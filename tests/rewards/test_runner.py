"""runner: what a reward call comes to (ok / error / timeout / invalid), counted and logged once.

These call in this process; the real worker processes are tested in test_pool.py.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from asyncrl.data.tasks import make_task
from asyncrl.errors import ConfigError, RewardTimeout
from asyncrl.rewards.runner import RewardStats, call_reward, check_signature

ROW = make_task("arithmetic", 1)[0]


def crashing_reward(*args: Any) -> float:
    raise ZeroDivisionError("boom")


def test_ok_result_keeps_numeric_details() -> None:
    outcome = call_reward(lambda: {"score": 0.5, "acc": True, "pred": "text is dropped"})
    assert (outcome.result.score, outcome.result.status, outcome.result.details) == (0.5, "ok", {"acc": 1.0})
    assert outcome.trace == ""


def test_raise_is_error_naming_where() -> None:
    outcome = call_reward(lambda: crashing_reward())
    assert (outcome.result.score, outcome.result.status) == (0.0, "error")
    assert outcome.result.error.startswith("ZeroDivisionError: boom in test_runner.py:")
    assert "Traceback" in outcome.trace and "crashing_reward" in outcome.trace


def test_system_exit_is_an_error_not_an_exit() -> None:
    def leaving() -> float:
        raise SystemExit(3)

    assert call_reward(leaving).result.error.startswith("SystemExit: 3")


def test_reward_timeout_raised_inside_is_a_timeout() -> None:
    def sandboxed() -> float:
        raise RewardTimeout("sandbox killed it")

    result = call_reward(sandboxed).result
    assert result.status == "timeout" and "sandbox killed it" in result.error


@pytest.mark.parametrize("value", [{"acc": 1.0}, {"score": "1"}, "1.0", math.nan, math.inf, None, [1.0]])
def test_malformed_return_values_are_invalid(value: Any) -> None:
    result = call_reward(lambda: value).result
    assert (result.score, result.status) == (0.0, "invalid") and "returned" in result.error


def test_error_text_is_one_line() -> None:
    def multiline() -> float:
        raise ValueError("first\nsecond")

    assert "\n" not in call_reward(multiline).result.error


def test_stats_count_each_kind_and_log_it_once(caplog: pytest.LogCaptureFixture) -> None:
    values = {"ok": 1.0, "nan": math.nan}
    stats = RewardStats()
    with caplog.at_level(logging.WARNING, logger="asyncrl.reward"):
        for text in ["ok", "boom", "nan", "boom", "nan"]:
            stats.record(call_reward(lambda t=text: values[t] if t in values else crashing_reward()), ROW.data_source)
    assert stats.metrics() == {"reward/ok_count": 1.0, "reward/errors": 2.0, "reward/timeouts": 0.0,
                               "reward/invalid": 2.0}
    assert len(caplog.records) == 2  # one per failure kind
    assert "ZeroDivisionError: boom" in caplog.text and "Traceback" in caplog.text
    assert f"data source '{ROW.data_source}'" in caplog.text


def test_check_signature_accepts_verl_shapes() -> None:
    def verl(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
        return 0.0

    check_signature(verl, "f.py:verl")
    check_signature(lambda *args, **kwargs: 0.0, "f.py:anything")


def test_check_signature_rejects_wrong_arity_naming_the_key() -> None:
    def two_args(solution_str: str, ground_truth: str) -> float:
        return 0.0

    with pytest.raises(ConfigError, match=r"reward.custom_function='f.py:two_args': two_args\(solution_str"):
        check_signature(two_args, "f.py:two_args")
