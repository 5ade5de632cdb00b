"""Tail batching in the colocated and one-step-off pipelines with the tiny model: over a run no
prompt is lost or trained twice, each trained group has exactly R0 responses, a long round
trains exactly P0 queued prompts, and the queue survives a checkpoint."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.checkpoint import load_checkpoint_state
from tests.pipelines.helpers import make_context, read_jsonl

P0, R0 = 4, 4
TAIL = ["tail_batching.enable=true", "tail_batching.prompt_speculation=1.5", "data.task=longtail",
        "rollout.length_from_prompt=true", "data.max_response_length=48", f"data.train_batch_size={P0}",
        f"actor.ppo_mini_batch_size={P0}", f"rollout.n={R0}", "trainer.test_freq=0",
        "trainer.val_before_train=false"]


def run(out, *overrides):
    ctx = make_context(out, *TAIL, *overrides)
    asyncio.run(pipeline_module(ctx.cfg.pipeline).run(ctx))
    return ctx, read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "samples.jsonl")


def drawn_prompts(ctx) -> list[str]:
    """Every prompt the stream handed out so far (one epoch: the first `cursor` of its order)."""
    it = ctx.prompts
    assert it.epoch == 0
    return [it._rows[i].uid for i in it._order[: it._cursor]]


def check_nothing_lost(ctx, samples, queue_uids):
    trained = [s["prompt"] for s in samples]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    outstanding = [r.uid for r in ctx.prompts.outstanding]
    assert sorted(queue_uids) == sorted(u for u in outstanding if u in set(queue_uids))
    assert sorted(trained + outstanding) == sorted(drawn_prompts(ctx)), "a prompt was lost"


@pytest.mark.parametrize("pipeline", ["colocated", pytest.param("one_step_off", marks=pytest.mark.slow)])
def test_rounds_lose_nothing_and_long_rounds_train_the_queued_prompts(tiny_cache, tmp_path, pipeline):
    ctx, rows, samples = run(tmp_path, f"pipeline={pipeline}", "trainer.total_training_steps=7")
    assert [r["training/responses"] for r in rows] == [P0 * R0] * 7  # P0 groups of exactly R0
    long_steps = [r["step"] for r in rows if r["tail_batching/long_round"] == 1.0]
    assert long_steps, "no long round ran"
    short = [r for r in rows if r["tail_batching/long_round"] == 0.0]
    assert all(r["tail_batching/aborted_requests"] > 0 for r in short)
    queued_before = {}
    for r in rows:  # a long round drains exactly P0 of the queue
        if r["tail_batching/long_round"] == 1.0:
            assert r["tail_batching/queue_length"] == queued_before[r["step"] - 1] - P0
        queued_before[r["step"]] = r["tail_batching/queue_length"]
    by_step = {}
    for s in samples:
        by_step.setdefault(s["step"], []).append(s["prompt"])
    assert all(len(by_step[s]) == P0 for s in long_steps)
    key = "tail_batching/long_response_length/mean"
    long_len = [r[key] for r in rows if key in r]
    short_len = [r["tail_batching/short_response_length/mean"] for r in short]
    assert min(long_len) > sum(short_len) / len(short_len), "the long rounds should train the long prompts"
    check_nothing_lost(ctx, samples, [])


def test_the_long_prompt_queue_is_in_the_checkpoint_and_resumed(tiny_cache, tmp_path):
    ctx, rows, _ = run(tmp_path, "trainer.total_training_steps=2")
    state = load_checkpoint_state(tmp_path / "checkpoints" / "global_step_2")["pipeline"]
    queue = [r.uid for r in state["long_queue"]]
    assert len(queue) == rows[-1]["tail_batching/queue_length"] > 0
    ctx, rows, samples = run(tmp_path, "trainer.total_training_steps=6")
    assert [r["step"] for r in rows] == list(range(1, 7))
    check_nothing_lost(ctx, samples, [])
    long_steps = [r["step"] for r in rows if r["tail_batching/long_round"] == 1.0 and r["step"] > 2]
    first_long = [s["prompt"] for s in samples if s["step"] == long_steps[0]]
    assert set(queue) <= set(first_long)  # the queue from before the resume is trained first


def test_a_prompt_twice_in_one_batch_gets_distinct_group_uids():
    from asyncrl.pipelines.common import group_uids
    from asyncrl.types import PromptRow

    a, b = (PromptRow(uid=u, data_source="x", messages=(), ground_truth="") for u in "ab")
    assert group_uids([a, b, a, a], "@3") == ["a@3", "b@3", "a@3~2", "a@3~3"]


def test_batches_across_an_epoch_boundary_simulate(tmp_path):
    """A batch that wraps an epoch can draw a prompt twice: its two groups must not collide."""
    from asyncrl.config import load_config
    from asyncrl.sim.run import simulate

    cfg = load_config("examples/dapo_qwen7b_h20.yaml", [
        "trainer.nnodes=2", "rollout.tensor_model_parallel_size=1", "tail_batching.enable=true", "data.task_size=300",
        "data.train_batch_size=64", "actor.ppo_mini_batch_size=64", "trainer.total_training_steps=30",
        "sim.profile=h800-qwen2.5-7b", "data.max_response_length=8192", "sim.length_median=320",
        f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]"])
    simulate(cfg, log=lambda _: None)
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 30
