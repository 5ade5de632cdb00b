"""Slow rewards are loud: `reward/timeout_time_share` every step, one warning per run past WARN_SHARE."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.config.schema import RewardConfig
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.setup import build_context
from asyncrl.pipelines.slow_rewards import SHARE_KEY, WARN_SHARE, SlowRewards
from asyncrl.types import Group, PromptRow, Trajectory
from tests.pipelines.helpers import read_jsonl

HANG_ONE_IN_TEN = '''
import time
calls = 0
def reward(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if calls % 10 == 0:  # 1 response in 10 (per worker process; a killed worker's successor counts anew)
        time.sleep(600)
    return 0.0
'''


def group(*statuses: str) -> Group:
    trajectories = []
    for status in statuses:
        t = Trajectory("r", [1], [2], [0.0], [0], "stop", reward_status=status)
        trajectories.append(t)
    return Group("g", PromptRow("p", "arithmetic", (), "3"), trajectories)


def test_share_is_timeout_seconds_over_pool_seconds_and_warns_once() -> None:
    """Step 1: 2 timeouts of 0.5 s on 2 processes over a 1 s step -> 1.0 / 2.0 = 0.5; step 2: no new
    wait -> 0.0; step 3: 0.1 s more over 2 x 1 s -> 0.05. One warning, at step 1."""
    lines: list[str] = []
    watch, cfg = SlowRewards(), RewardConfig(timeout_s=0.5)
    shares = []
    for step, waited in enumerate((1.0, 1.0, 1.1), start=1):
        metrics = {"reward/timeout_wait_s": waited, "reward/workers": 2.0, "timing_s/step": 1.0}
        watch.observe(cfg, step, metrics, [group("ok", "timeout")], lines.append)
        shares.append(metrics[SHARE_KEY])
    assert shares == pytest.approx([0.5, 0.0, 0.05], rel=1e-9, abs=1e-12)
    assert len(lines) == 1 and lines[0].startswith("warning: reward timeouts took 50% of step 1")
    assert "reward.timeout_s=0.5" in lines[0]
    assert "asyncrl.rewards.puzzles:compute_arithmetic" in lines[0] and "(data source 'arithmetic')" in lines[0]


def test_share_without_reward_metrics_is_zero() -> None:
    metrics: dict[str, float] = {"timing_s/step": 2.0}
    SlowRewards().observe(RewardConfig(), 1, metrics, [], lambda line: pytest.fail(line))
    assert metrics[SHARE_KEY] == 0.0


def test_a_reward_hanging_on_one_response_in_ten_is_loud(tiny_cache: Path, tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANG_ONE_IN_TEN)
    cfg = load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]", "num_threads=1",
                             "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.val_before_train=false",
                             "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=4",
                             "data.max_response_length=4", "data.val_size=0",
                             f"reward.custom_function={tmp_path / 'hang.py'}:reward",
                             "reward.timeout_s=0.3", "reward.num_workers=2", "reward.max_failure_ratio=1.0"])
    lines: list[str] = []
    ctx = build_context(cfg, log=lines.append)
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) == 2 and all(SHARE_KEY in r for r in steps)
    assert steps[0]["reward/timeouts"] >= 2 and steps[0][SHARE_KEY] > WARN_SHARE, steps[0]
    warnings = [line for line in lines if "reward timeouts took" in line]
    assert len(warnings) == 1, lines
    assert "reward.timeout_s=0.3" in warnings[0] and "hang.py:reward" in warnings[0]
