"""TRL-signature reward functions: called once per batch with TRL's arguments, weighted and summed,
a None skipped, a failing function failing its batch as a counted status, never a crash."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from asyncrl.errors import ConfigError
from asyncrl.rewards import RewardPool
from asyncrl.rewards.batch_functions import BatchFunctions, function_name, register_callable, resolve, trl_arguments
from asyncrl.types import PromptRow

CHAT = PromptRow("train-0", "trl", ({"role": "user", "content": "2+3?"},), "5", extra_info={"answer": "5"})
RAW = PromptRow("train-1", "trl", (), "7", extra_info={"answer": "7", "level": 2}, text="3+4=")


def functions(*fns: Any, weights: tuple[float, ...] = (), timeout_s: float = 5.0) -> BatchFunctions:
    return BatchFunctions([register_callable(f) for f in fns], weights, timeout_s)


def test_trl_arguments_follow_each_rows_format_and_carry_the_columns() -> None:
    kwargs = trl_arguments([CHAT, RAW], ["5", "7"])
    assert kwargs["prompts"] == [[{"role": "user", "content": "2+3?"}], "3+4="]
    assert kwargs["completions"] == [[{"role": "assistant", "content": "5"}], "7"]
    assert kwargs["answer"] == ["5", "7"] and kwargs["level"] == [None, 2]
    assert kwargs["ground_truth"] == ["5", "7"] and kwargs["data_source"] == ["trl", "trl"]


def test_weighted_sum_skips_none_and_an_all_none_response_is_invalid() -> None:
    calls: list[int] = []

    def exact(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float | None]:
        calls.append(len(prompts))
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

    def only_raw(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [None if isinstance(p, list) else 0.5 for p in prompts]

    rows, texts = [RAW, RAW, CHAT], ["7", "8", "x"]
    results = functions(exact, only_raw, weights=(2.0, 1.0)).score(rows, texts)
    assert calls == [3]  # once per batch, as TRL calls it
    assert [r.score for r in results] == [2.5, 0.5, 0.0]
    assert results[0].details == {"exact": 1.0, "only_raw": 0.5}
    assert results[2].details == {"exact": 0.0} and results[2].status == "ok"
    none = functions(lambda prompts, completions, **_: [None] * len(prompts)).score([RAW], ["7"])
    assert (none[0].score, none[0].status) == (0.0, "invalid")


@pytest.mark.parametrize(("fn", "says"), [
    (lambda prompts, completions, **_: 1 / 0, "raised ZeroDivisionError"),
    (lambda prompts, completions, **_: [1.0], "returned 1 values, not a list of 2 values"),
    (lambda prompts, completions, **_: [1.0, "high"], "returned 'high', not a finite number or None"),
    (lambda prompts, completions, **_: [1.0, float("nan")], "returned nan"),
], ids=["raises", "wrong-length", "not-a-number", "nan"])
def test_a_failing_function_fails_its_batch_with_a_status(fn: Any, says: str) -> None:
    results = functions(fn).score([RAW, RAW], ["7", "7"])
    assert [(r.score, r.status) for r in results] == [(0.0, "error")] * 2
    assert says in results[0].error


def test_a_function_past_the_timeout_fails_its_batch_as_timeout() -> None:
    release = threading.Event()
    results = functions(lambda prompts, completions, **_: release.wait(5) and [1.0], timeout_s=0.05).score([RAW], ["7"])
    release.set()
    assert (results[0].status, results[0].score) == ("timeout", 0.0)
    assert "reward.timeout_s" in results[0].error


def test_names_resolve_importable_functions_and_callables_of_this_process_only() -> None:
    assert resolve("asyncrl.rewards.batch_functions:trl_arguments") is trl_arguments
    name = register_callable(len)
    assert resolve(name) is len and function_name(name) == "len"
    with pytest.raises(ConfigError, match="reward.functions: driver:gone#1 is a Python callable of another process"):
        resolve("driver:gone#1")
    with pytest.raises(ConfigError, match="reward.function_weights has 1 weights for 2 reward.functions"):
        BatchFunctions([name, name], (1.0,), 1.0)


def test_an_importable_function_runs_in_the_reward_pool_and_a_driver_callable_here(tmp_path: Path) -> None:
    pids = tmp_path / "pids.txt"
    row = PromptRow("train-2", "trl", (), "7", extra_info={"pid_log": str(pids)}, text="3+4=")
    here: list[int] = []

    def ones(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        here.append(os.getpid())
        return [1.0] * len(prompts)

    driver = register_callable(ones)
    pool = RewardPool(num_workers=1, timeout_s=30.0)
    try:
        fns = BatchFunctions(["tests.trl_rewards:pid_reward", driver], (), 30.0, pool)
        results = fns.score([row, row], ["7", "8"])
        assert [(r.score, r.status) for r in results] == [(1.0, "ok")] * 2
        (pid, parent), = [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]
        assert pid in pool.pids() and pid != os.getpid() and parent == os.getpid()  # a pool worker of ours
        assert here == [os.getpid()]
        wrong = BatchFunctions(["asyncrl.rewards.batch_functions:trl_arguments"], (), 30.0, pool).score([row], ["7"])
        assert wrong[0].status == "error" and "reward function trl_arguments raised TypeError" in wrong[0].error
    finally:
        pool.close()
