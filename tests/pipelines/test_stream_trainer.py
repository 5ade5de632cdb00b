"""The stream trainer in the colocated pipeline with the tiny model: gradients of finished groups
are computed while the rest generate, every group of the batch is trained exactly once, and the
policy still learns."""

from __future__ import annotations

import pytest

from tests.pipelines.helpers import read_jsonl, run_pipeline, val_scores

STREAM = ["stream_trainer.enable=true", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=4",
          "trainer.val_before_train=false", "trainer.test_freq=0"]


def test_groups_stream_into_one_update_per_step(tiny_cache, tmp_path):
    rows = run_pipeline(tmp_path, *STREAM, "data.task=longtail", "rollout.length_from_prompt=true",
                        "data.max_response_length=64", "trainer.total_training_steps=3")
    assert [r["training/responses"] for r in rows] == [32] * 3
    # never before min_done; past max_done only when several groups finish in one engine step
    # (responses capped at 64 tokens end together), so the first look already sees more than half done
    assert all(0.2 <= r["stream_trainer/fired_at"] <= 1.0 for r in rows)
    assert sum(r["stream_trainer/streamed_groups"] for r in rows) > 0  # some gradients before gen ended
    assert {"timing_s/update_actor", "actor/pg_loss", "actor/grad_norm"} <= set(rows[0])
    assert "timing_s/old_log_prob" not in rows[0]  # one step per batch: the update's own forward gives them
    trained = [s["prompt"] for s in read_jsonl(tmp_path / "samples.jsonl")]
    assert len(trained) == len(set(trained)) == 24


@pytest.mark.slow
def test_reward_rises_with_all_three_remedies(tiny_cache, tmp_path):
    rows = run_pipeline(tmp_path, "stream_trainer.enable=true", "tail_batching.enable=true",
                        "reward_scheduler.enable=true", "actor.ppo_mini_batch_size=32",
                        "trainer.total_training_steps=40", "trainer.test_freq=20")
    val, train = val_scores(rows), [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    # learning where it is robust (issue 34): the training reward's first and last 6 updates (32 prompts
    # x 8 responses each; a window's mean has a standard error of about 0.013 here) must rise by 3 of
    # those; measured +0.079 with AVX-512 kernels and +0.104 with AVX2 on the pinned tiny model. One
    # held-out validation (128 prompts) swings by +-0.04 from the next, so it need only not fall.
    assert len(train) == 40 and sum(train[-6:]) / 6 >= sum(train[:6]) / 6 + 0.04, train
    assert len(val) == 3 and max(val[1:]) >= val[0], val
    assert any(r.get("tail_batching/long_round") == 1.0 for r in rows)
