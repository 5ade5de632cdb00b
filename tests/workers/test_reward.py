"""RewardWorker: signature check at start, statuses on trajectories, a loud stop past the failure ratio."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from asyncrl.config.long_tail import RewardSchedulerConfig, SandboxConfig
from asyncrl.config.schema import RewardConfig
from asyncrl.errors import ConfigError, RewardError
from asyncrl.rewards import RewardResult
from asyncrl.types import Group, PromptRow, Trajectory
from asyncrl.workers.reward import FailureWindow, RewardWorker

REWARDS = '''
import time

def reward(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "ok":
        return 1.0
    if solution_str == "hang":
        time.sleep(1000)
    return 1 / 0


def two_args(solution_str, ground_truth):
    return 1.0
'''
WORDS = ("ok", "bad", "hang")
ROW = PromptRow(uid="p", data_source="my_source", messages=(), ground_truth="1")


class WordTokenizer:
    """Decodes token i to WORDS[i]: a response of [0] reads "ok"."""

    def batch_decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [" ".join(WORDS[i] for i in seq) for seq in ids]


def traj(word: str) -> Trajectory:
    return Trajectory("r", (1,), (WORDS.index(word),), (0.0,), (0,), "stop")


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(REWARDS)
    return f"{path}:reward"


@pytest.fixture
def worker(spec: str) -> Iterator[RewardWorker]:
    cfg = RewardConfig(custom_function=spec, timeout_s=0.5, num_workers=2, max_failure_ratio=0.5)
    w = RewardWorker(WordTokenizer(), cfg, window=4)
    yield w
    w.close()


def test_check_rejects_a_wrong_signature(spec: str) -> None:
    cfg = RewardConfig(custom_function=spec.replace(":reward", ":two_args"))
    w = RewardWorker(WordTokenizer(), cfg)
    with pytest.raises(ConfigError, match=r"reward.custom_function=.*two_args\(solution_str, ground_truth\)"):
        w.check([ROW])
    w.close()


def test_check_accepts_builtins_and_rejects_unknown_sources() -> None:
    w = RewardWorker(WordTokenizer(), RewardConfig())
    w.check([PromptRow("a", "gsm8k", (), "1"), PromptRow("b", "code", (), "[]")])
    with pytest.raises(ConfigError, match="no reward function for data_source 'nope'"):
        w.check([PromptRow("c", "nope", (), "1")])
    w.close()


def test_score_groups_sets_statuses_and_metrics(worker: RewardWorker) -> None:
    group = Group("g", ROW, [traj("ok"), traj("bad"), traj("hang")])
    worker.score_groups([group])  # 2 of 3 failed, but the window (4) is not full yet
    assert [(t.reward, t.reward_status) for t in group.trajectories] == [(1.0, "ok"), (0.0, "error"), (0.0, "timeout")]
    assert worker.metrics() == {"reward/ok_count": 1.0, "reward/errors": 1.0, "reward/timeouts": 1.0,
                                "reward/invalid": 0.0, "reward/timeout_wait_s": 0.5, "reward/workers": 2.0}
    worker.score_groups([Group("g2", ROW, [traj("ok"), traj("ok")])])  # one on the killed worker's replacement: charged
    assert worker.metrics()["reward/timeout_wait_s"] > 0.5


def test_too_many_failures_raise_a_reward_error(worker: RewardWorker) -> None:
    trajectories = [traj("bad"), traj("bad"), traj("bad"), traj("ok")]
    with pytest.raises(RewardError) as caught:
        worker.score([ROW] * 4, trajectories)
    message = str(caught.value)
    assert message.startswith("reward: 3 of 4 recent rewards failed (errors 3: ZeroDivisionError: division by "
                              "zero in my_reward.py:")
    assert "data source 'my_source'" in message and "reward.max_failure_ratio=0.5" in message
    assert "\n" not in message
    assert [t.reward_status for t in trajectories] == ["error", "error", "error", "ok"]  # set before raising


def test_failures_at_the_ratio_do_not_raise(worker: RewardWorker) -> None:
    worker.score([ROW] * 4, [traj("bad"), traj("ok"), traj("bad"), traj("ok")])  # 2 of 4 == 0.5: allowed


def test_ratio_of_one_never_stops(spec: str) -> None:
    w = RewardWorker(WordTokenizer(), RewardConfig(custom_function=spec, max_failure_ratio=1.0), window=2)
    try:
        w.score([ROW] * 2, [traj("bad"), traj("bad")])
    finally:
        w.close()


def test_bad_num_workers_names_the_key() -> None:
    with pytest.raises(ConfigError, match="reward.num_workers"):
        RewardWorker(WordTokenizer(), RewardConfig(num_workers=0))


def result(status: str, error: str = "") -> RewardResult:
    return RewardResult(0.0 if status != "ok" else 1.0, status=status, error=error)


def test_window_slides_over_small_calls() -> None:
    window = FailureWindow(max_ratio=0.5, size=4)
    window.add(["s"], [result("ok")])
    window.add(["s", "s"], [result("error", "E1"), result("error", "E2")])  # 2 of 3: not full yet
    with pytest.raises(RewardError, match=r"3 of 4 recent rewards failed \(errors 2: E1; timeouts 1: T1; "):
        window.add(["t"], [result("timeout", "T1")])
    window.add(["s", "s"], [result("ok"), result("ok")])  # window now: error, timeout, ok, ok


def test_window_judges_one_large_call_whole() -> None:
    window = FailureWindow(max_ratio=0.25, size=2)
    window.add(["a", "b", "c", "d"], [result("invalid", "I"), result("ok"), result("ok"), result("ok")])  # 1 of 4
    with pytest.raises(RewardError, match=r"2 of 4 recent .*data source 'a', 'b'\)"):
        window.add(["a", "b", "c", "d"], [result("invalid", "I"), result("error", "E"), result("ok"), result("ok")])


CODE = ('{"fn_name": "f", "tests": [{"input": [1], "output": 4}, {"input": [2], "output": 7}]}')
PROGRAMS = ("```python\ndef f(x):\n    return x*3+1\n```", "```python\ndef f(x):\n    return 0\n```")


class ProgramTokenizer:
    """Decodes token i to PROGRAMS[i]."""

    def batch_decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [PROGRAMS[seq[0]] for seq in ids]


def test_adaptive_code_timeouts_learn_from_passing_tests() -> None:
    scheduler = RewardSchedulerConfig(enable=True, timeout_lambda=1.5, min_timeout_s=2.0, max_timeout_s=30.0)
    w = RewardWorker(ProgramTokenizer(), RewardConfig(num_workers=1), sandbox=SandboxConfig(), scheduler=scheduler)
    row = PromptRow(uid="c", data_source="code", messages=(), ground_truth=CODE)
    try:
        assert w.metrics()["reward/code_timeout_s_mean"] == 30.0  # no correct run yet: max_timeout_s
        assert w.code_timeouts is not None and w.code_timeouts.attach(row).extra_info["code_timeouts_s"] == [30.0] * 2
        wrong = Trajectory("r", (1,), (1,), (0.0,), (0,), "stop")
        w.score([row], [wrong])
        assert wrong.reward == 0.0 and w.metrics()["reward/code_timeout_cases"] == 0.0  # wrong answers teach nothing
        right = Trajectory("r", (1,), (0,), (0.0,), (0,), "stop")
        w.score([row], [right])
        assert right.reward == 1.0 and not any(k.startswith("test_") for k in right.reward_details)
        assert w.metrics()["reward/code_timeout_cases"] == 2.0
        assert w.metrics()["reward/code_timeout_s_mean"] == 2.0  # 1.5 x a few ms, clamped up to min_timeout_s
        attached = w.code_timeouts.attach(row).extra_info
        assert attached["code_timeouts_s"] == [2.0, 2.0]
        assert attached["reward_deadline_s"] == 2.0 + 2.0 + 5.0  # the pool waits for every test's timeout
    finally:
        w.close()


def test_scheduler_off_leaves_rows_alone() -> None:
    w = RewardWorker(ProgramTokenizer(), RewardConfig(num_workers=1))
    try:
        assert w.code_timeouts is None and "reward/code_timeout_s_mean" not in w.metrics()
    finally:
        w.close()


def test_dapo_overlong_punishment_is_added_and_its_verl_keys_map() -> None:
    from asyncrl.config import load_config

    base = ["reward_model.reward_manager=dapo", "data.max_response_length=20"]
    for spelling in ("+reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer"):
        cfg = load_config(None, [*base, f"{spelling}.enable=True", f"{spelling}.len=4",
                                 f"{spelling}.penalty_factor=2.0"])
        assert (cfg.reward.overlong_buffer, cfg.reward.overlong_penalty_factor) == (4, 2.0)
    from dataclasses import replace

    from asyncrl.rewards.batch_functions import register_callable

    ones = register_callable(lambda prompts, completions, **_: [1.0] * len(prompts))
    w = RewardWorker(WordTokenizer(), replace(cfg.reward, functions=(ones,)), max_response_length=20)
    trajs = [Trajectory("r", (1,), (0,) * n, (0.0,) * n, (0,) * n, "length") for n in (16, 18)]
    w.score([ROW, ROW], trajs)
    w.close()
    assert [t.reward_details["overlong_penalty"] for t in trajs] == [0.0, -1.0]  # 18 tokens: half the buffer, x2
    assert [t.reward for t in trajs] == [1.0, 0.0]
    with pytest.raises(ConfigError, match="reward.overlong_buffer=30 is longer than the responses it punishes"):
        load_config(None, [*base, "reward.overlong_buffer=30"])
