"""The fully async pipeline's guarantees: the freshness budget, the lag cap, every prompt
trained exactly once in every mode, partial rollout, failure propagation, learning."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from asyncrl.pipelines import fully_async
from asyncrl.workers.rollout_server import RolloutServer
from tests.pipelines.helpers import make_context, read_jsonl, run_pipeline, val_scores

pytestmark = pytest.mark.slow

SMALL = ["pipeline=fully_async", "trainer.val_before_train=false", "trainer.test_freq=0",
         "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.train_batch_size=8"]
MODES = {
    "a_on_policy": ["async_training.trigger_parameter_sync_step=1"],
    "b_stream_off_policy": ["async_training.trigger_parameter_sync_step=2"],
    "c_stale": ["async_training.staleness_threshold=1.0"],
    "d_partial": ["async_training.staleness_threshold=0.5", "async_training.partial_rollout=true",
                  "data.max_response_length=24"],
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_prompt_trained_exactly_once(tiny_cache, tmp_path, mode):
    rows = run_pipeline(tmp_path, *SMALL, *MODES[mode], "rollout.total_rollout_steps=30")
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    prompts = [s["prompt"] for s in ledger]
    assert len(prompts) == 30 and len(set(prompts)) == 30
    assert rows[-1]["training/global_step"] == 8  # ceil(30 / 4) local updates


def constant_reward(prompts: list, completions: list, **_: object) -> list[float]:
    """Every response scores the same: every group's rewards agree."""
    return [0.5] * len(prompts)


@pytest.mark.parametrize("reward", ["", f"reward.functions=[{__name__}:constant_reward]"], ids=["scored", "all-agree"])
def test_dynamic_sampling_consumes_each_prompt_once_and_never_waits_forever(tiny_cache, tmp_path, reward):
    # threshold 0: a version starts exactly the R prompts an update takes, so a dropped group leaves
    # the trainer short until the next sync; it trains on fewer rather than wait (all-agree: every
    # group is dropped, nothing is trained, and the run still ends)
    rows = run_pipeline(tmp_path, *SMALL, "algorithm.filter_groups.enable=true", "rollout.total_rollout_steps=24",
                        *[r for r in [reward] if r])
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    filtered = rows[-1]["fully_async/count/filtered_groups"]
    assert len(ledger) + filtered == 24 and len({s["prompt"] for s in ledger}) == len(ledger)
    assert sum(r.get("train/filtered_groups", 0) for r in rows) == filtered
    if reward:
        assert (filtered, ledger) == (24, [])


def test_threshold_zero_starts_exactly_R_times_T_per_version(tiny_cache, tmp_path):
    run_pipeline(tmp_path, *SMALL, "async_training.trigger_parameter_sync_step=2",
                 "async_training.require_batches=2", "rollout.total_rollout_steps=48")
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    per_version = Counter(s["start_version"] for s in ledger)
    assert set(per_version.values()) == {16}, per_version  # R x T = (2 x 4) x 2
    assert all(s["trained_at_version"] == s["start_version"] for s in ledger)


def test_no_trained_sample_exceeds_the_lag_cap_and_a_slow_group_is_trained_not_dropped(tiny_cache, tmp_path):
    # the rollouter may run 3 versions ahead, the cap allows 1: pacing (the default) trains each
    # group before the sync that would put it past the cap, however slow it was
    rows = run_pipeline(tmp_path, *SMALL, "async_training.staleness_threshold=2.0",
                        "async_training.max_version_lag=1", "rollout.total_rollout_steps=40")
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    assert max(s["trained_at_version"] - s["start_version"] for s in ledger) <= 1
    assert max(s["trained_at_version"] - s["start_version"] for s in ledger) == 1  # the cap was reached
    assert len({s["prompt"] for s in ledger}) == 40 == len(ledger)
    assert rows[-1]["fully_async/count/dropped_stale"] == 0
    assert sorted(int(s["uid"].rsplit("@a", 1)[1]) for s in ledger) == list(range(1, 41))  # each started once


def test_partial_rollout_spans_versions(tiny_cache, tmp_path):
    # threshold 1: 4 groups beyond the 4 an update takes, decoded one group (4 sequences) at a time, so
    # some are always still decoding when the update ends and the sync interrupts them
    rows = run_pipeline(tmp_path, *SMALL, *MODES["d_partial"], "async_training.staleness_threshold=1.0",
                        "rollout.total_rollout_steps=40", "rollout.ignore_eos=true", "data.max_response_length=48",
                        "rollout.max_num_seqs=4")
    assert max(r.get("fully_async/partial/continuations", 0) for r in rows) > 0
    assert max(s["segments"] for s in read_jsonl(tmp_path / "samples.jsonl")) >= 2


def test_the_in_flight_cap_binds(tiny_cache, tmp_path):
    # threshold 1 lets 8 prompts start per version; one engine at 1 per server keeps 1 in flight
    rows = run_pipeline(tmp_path, *SMALL, "async_training.staleness_threshold=1.0",
                        "async_training.max_concurrent_samples_per_server=1", "rollout.total_rollout_steps=16")
    assert max(r["rollouter/peak_in_flight"] for r in rows) == 1
    assert rows[-1]["fully_async/static/max_concurrent_samples"] == 1
    prompts = [s["prompt"] for s in read_jsonl(tmp_path / "samples.jsonl")]
    assert len(prompts) == 16 == len(set(prompts))


def test_partial_rollout_with_threshold_zero_trains_every_prompt_on_policy(tiny_cache, tmp_path):
    run_pipeline(tmp_path, *SMALL, "async_training.partial_rollout=true",
                 "async_training.trigger_parameter_sync_step=2", "rollout.total_rollout_steps=24")
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    assert len({s["prompt"] for s in ledger}) == 24 == len(ledger)
    assert all(s["trained_at_version"] == s["start_version"] and s["segments"] == 1 for s in ledger)


def test_a_crash_in_the_rollouter_fails_the_run(tiny_cache, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = RolloutServer.generate_scored

    async def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("engine exploded")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(RolloutServer, "generate_scored", flaky)
    ctx = make_context(tmp_path, *SMALL, "rollout.total_rollout_steps=40")
    with pytest.raises(RuntimeError, match="engine exploded"):
        asyncio.run(fully_async.run(ctx))


STEPS = {"a_on_policy": 60}
"""Mode (a) learns the slowest here (4-prompt updates, each on-policy): after 80 updates its training
reward had risen +0.085 (AVX-512 kernels) and +0.058 (AVX2) on the pinned tiny model, against a
standard error of 0.02 for the difference of two 16-update means; after 120, +0.142 / +0.170. The
other modes rose +0.117 to +0.150 in 80 updates (issue 34)."""


def assert_learns(tmp_path, mode: str, backend: str) -> None:
    steps = STEPS.get(mode, 40)
    rows = run_pipeline(tmp_path, "pipeline=fully_async", f"backend={backend}", *MODES[mode],
                        f"trainer.total_training_steps={steps}", "rollout.test_freq=20")
    val, train = val_scores(rows), [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    # learning where it is robust: the training reward's last 16 updates must beat its first 16 by 0.05,
    # 2.5 standard errors (a run that learns nothing fails; the rises measured are above). One held-out
    # validation (128 prompts x 4) swings by +-0.04 from the next, and a fully async run is not
    # bit-reproducible (its threads interleave): mode (b) scored 0.240, 0.283, 0.318 in one run and
    # 0.240, 0.283, 0.275 in another, so held out it need only rise.
    assert len(train) == 2 * steps and sum(train[-16:]) / 16 >= sum(train[:16]) / 16 + 0.05, train
    assert max(val[1:]) > val[0], val


# two modes on Ray, two in one process (the same pipeline code; the Ray tests run one at a time)
@pytest.mark.parametrize("mode", ["a_on_policy", "d_partial"])
def test_modes_learn_on_ray(tiny_cache, ray_cluster, tmp_path, mode):
    assert_learns(tmp_path, mode, "ray")


@pytest.mark.parametrize("mode", ["b_stream_off_policy", "c_stale"])
def test_modes_learn_in_one_process(tiny_cache, tmp_path, mode):
    assert_learns(tmp_path, mode, "local")


def test_resume_continues_the_count_and_syncs_once(tiny_cache, tmp_path):
    common = [*SMALL, "trainer.save_freq=2", "async_training.staleness_threshold=0.5"]
    run_pipeline(tmp_path, *common, "rollout.total_rollout_steps=16")
    ctx = make_context(tmp_path, *common, "rollout.total_rollout_steps=32")
    asyncio.run(fully_async.run(ctx))
    ledger = read_jsonl(tmp_path / "samples.jsonl")
    assert len(ledger) == 32 and len({s["prompt"] for s in ledger}) == 32
    versions = [s["trained_at_version"] for s in ledger]
    assert versions == sorted(versions) and versions[-1] == 7
    # resumed at version 4: one push of the checkpoint's weights, then one sync per update
    assert ctx.synchronizer.version == 8 and ctx.synchronizer.transfers == 1 + 4
