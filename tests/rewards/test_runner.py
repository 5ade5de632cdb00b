"""score_response/score_batch: errors and hangs become results and counters, never crashes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl.data.tasks import make_task
from asyncrl.errors import RewardTimeout
from asyncrl.rewards.registry import resolve_reward_fn
from asyncrl.rewards.runner import RewardStats, score_batch, score_response

ROW = make_task("arithmetic", 1)[0]


class HangingReward:
    """Blocks until released (so the abandoned thread ends when the test does)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, *args: Any) -> float:
        self.release.wait(30)
        return 1.0


@pytest.fixture
def hanging() -> Iterator[HangingReward]:
    fn = HangingReward()
    yield fn
    fn.release.set()


def crashing_reward(*args: Any) -> float:
    raise ZeroDivisionError("boom")


def test_ok_result_keeps_numeric_details() -> None:
    def fn(*args: Any) -> dict[str, Any]:
        return {"score": 0.5, "acc": True, "pred": "text is dropped"}

    result = score_response(ROW, "x", reward_fn=fn)
    assert (result.score, result.status, result.details) == (0.5, "ok", {"acc": 1.0})


def test_builtin_reward_end_to_end() -> None:
    fn = resolve_reward_fn(ROW.data_source)
    assert score_response(ROW, f"It is {ROW.ground_truth}", reward_fn=fn).score == 1.0


def test_raising_reward_is_an_error_result() -> None:
    stats = RewardStats()
    result = score_response(ROW, "x", reward_fn=crashing_reward, stats=stats)
    assert (result.score, result.status) == (0.0, "error") and "ZeroDivisionError: boom" in result.error
    assert stats.metrics()["reward/error_count"] == 1.0


@pytest.mark.parametrize("value", [{"acc": 1.0}, "1.0", float("nan"), None])
def test_malformed_return_values_are_errors(value: Any) -> None:
    assert score_response(ROW, "x", reward_fn=lambda *a: value).status == "error"


def test_hanging_reward_times_out_within_timeout(hanging: HangingReward) -> None:
    stats = RewardStats()
    start = time.monotonic()
    result = score_response(ROW, "x", reward_fn=hanging, timeout_s=0.3, stats=stats)
    assert time.monotonic() - start < 1.0
    assert (result.score, result.status) == (0.0, "timeout")
    assert stats.metrics()["reward/timeout_count"] == 1.0 and stats.abandoned == 1
    hanging.release.set()
    time.sleep(0.05)
    assert stats.abandoned == 0


def test_reward_timeout_raised_inside_is_a_timeout() -> None:
    def fn(*args: Any) -> float:
        raise RewardTimeout("sandbox killed it")

    result = score_response(ROW, "x", reward_fn=fn)
    assert result.status == "timeout" and "sandbox killed it" in result.error


def test_code_infinite_loop_is_timeout_status() -> None:
    row = make_task("code", 1)[0]
    row = type(row)(**{**row.__dict__, "extra_info": {**row.extra_info, "code_timeout_s": 0.5}})
    result = score_response(row, "```python\nwhile True:\n    pass\n```", reward_fn=resolve_reward_fn("code"))
    assert (result.score, result.status) == (0.0, "timeout")


def test_score_batch_mixes_outcomes_in_order(hanging: HangingReward) -> None:
    rows = make_task("arithmetic", 6)

    def mixed(data_source: str, text: str, truth: str, extra: dict[str, Any]) -> float:
        return {"ok": lambda: 1.0, "err": lambda: crashing_reward(), "hang": lambda: hanging()}[text]()

    texts = ["ok", "err", "hang", "ok", "hang", "err"]
    stats = RewardStats()
    start = time.monotonic()
    results = score_batch(rows, texts, reward_fn=mixed, timeout_s=0.3, max_workers=3, stats=stats)
    assert time.monotonic() - start < 1.5
    assert [r.status for r in results] == ["ok", "error", "timeout", "ok", "timeout", "error"]
    assert (stats.ok, stats.error, stats.timeout) == (2, 2, 2)
