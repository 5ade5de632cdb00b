"""The colocated pipeline end to end with the built-in tiny model: it learns, it resumes
exactly, and its outputs (metrics, checkpoint, trace, generations) are usable."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.pipelines.helpers import read_jsonl, run_pipeline, val_scores

pytestmark = pytest.mark.slow


def test_reward_rises(tiny_cache, tmp_path):
    rows = run_pipeline(tmp_path, "trainer.total_training_steps=40", "trainer.test_freq=20")
    val = val_scores(rows)
    train = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    assert len(val) == 3 and len(train) == 40
    assert max(val[1:]) >= val[0] + 0.05 and sum(val[1:]) / len(val[1:]) >= val[0] + 0.03, val
    assert sum(train[-6:]) / 6 > sum(train[:6]) / 6 + 0.05, train
    ckpt = tmp_path / "checkpoints" / "global_step_40" / "actor"
    AutoModelForCausalLM.from_pretrained(ckpt)
    assert AutoTokenizer.from_pretrained(ckpt).decode([20, 21]) == "ef"
    assert "traceEvents" in json.loads((tmp_path / "trace.json").read_text())
    assert {"timing_s/gen", "timing_s/reward", "timing_s/adv",
            "timing_s/update_actor", "timing_s/param_sync", "response_length/mean"} <= set(rows[1])
    assert "timing_s/old_log_prob" not in rows[1]  # float32 on CPU: the engine's log-probs are exact


def test_resume_continues_identically(tiny_cache, tmp_path):
    common = ["trainer.save_freq=2", "trainer.test_freq=0", "trainer.val_before_train=false",
              "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.n=4"]
    full = run_pipeline(tmp_path / "full", "trainer.total_training_steps=4", *common)
    run_pipeline(tmp_path / "split", "trainer.total_training_steps=2", *common)
    with (tmp_path / "split" / "generations.jsonl").open("a") as f:  # as if logged after the checkpoint
        f.write(json.dumps({"step": 3, "split": "train", "response": "lost"}) + "\n")
    resumed = run_pipeline(tmp_path / "split", "trainer.total_training_steps=4", *common)
    keys = ("critic/score/mean", "actor/pg_loss", "response_length/mean", "actor/grad_norm")
    by_step = {r["step"]: r for r in full}
    assert [r["step"] for r in resumed[2:]] == [3, 4]
    for row in resumed[2:]:
        for k in keys:
            assert row[k] == pytest.approx(by_step[row["step"]][k], rel=1e-4, abs=1e-6), (row["step"], k)
    assert_generations_resume(read_jsonl(tmp_path / "full" / "generations.jsonl"),
                              read_jsonl(tmp_path / "split" / "generations.jsonl"))


def assert_generations_resume(full: list[dict], split: list[dict]) -> None:
    """generations.jsonl: 16 trained responses a step (4 whole groups of 4), the prompt as text,
    the arithmetic reward (0 or 1, no parts); the resumed run's training lines are the
    uninterrupted run's (the line written after the checkpoint is gone); validation at the end
    (and at step 2 in the split run)."""
    train = [r for r in full if r["split"] == "train"]
    assert [r["step"] for r in train] == [s for s in (1, 2, 3, 4) for _ in range(16)]
    assert all(r["prompt"].strip() and isinstance(r["response"], str) and r["reward"] in (0.0, 1.0)
               and r["reward_parts"] == {} and r["start_version"] == r["end_version"] == r["step"] - 1 for r in train)
    assert len({r["group"] for r in train}) == 16 and {r["data_source"] for r in full} == {"arithmetic"}
    assert [r for r in split if r["split"] == "train"] == train
    assert {(r["split"], r["step"]) for r in split} - {(r["split"], r["step"]) for r in full} == {("val", 2)}


def test_interrupt_saves_a_checkpoint(tiny_cache, tmp_path):
    import asyncio

    from asyncrl.pipelines import colocated
    from asyncrl.pipelines.checkpoint import latest_checkpoint
    from tests.pipelines.helpers import make_context

    ctx = make_context(tmp_path, "trainer.total_training_steps=50", "trainer.test_freq=0",
                       "trainer.val_before_train=false")

    async def main():
        task = asyncio.create_task(colocated.run(ctx))
        log = tmp_path / "metrics.jsonl"
        while not (log.exists() and log.read_text().strip()):  # step 1 logged
            await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(main())
    path = latest_checkpoint(ctx.output_dir)
    assert path is not None and (path / "actor" / "model.safetensors").exists()


def test_recomputed_old_log_probs_equal_the_engines(tiny_cache, tmp_path):
    """Why `actor.old_log_probs=auto` takes the engine's log-probs in float32 on CPU: the pass
    it skips gives the same numbers up to float rounding."""
    rows = run_pipeline(tmp_path, "actor.old_log_probs=recompute", "trainer.total_training_steps=2",
                        "trainer.test_freq=0", "trainer.val_before_train=false")
    assert "timing_s/old_log_prob" in rows[0]
    assert 0 < rows[0]["training/rollout_logprob_diff_mean"] < 1e-4
