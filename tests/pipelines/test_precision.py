"""`model.dtype=bfloat16` through every pipeline on the CPU: the trainer computes in bf16
parameters over float32 masters (`model.mixed_precision=auto`) and the engines hold bf16
copies. Every sync here is verified bit for bit
(the synchronizer's `verify`): a float32 export or a float32 engine copy raises SyncError. The
engine's bf16 log-probs differ from the trainer's by bf16 noise, not more."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.pipelines import pipeline_module
from tests.pipelines.helpers import make_context, read_jsonl

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pipeline", ["colocated", "one_step_off", "fully_async"])
def test_bf16_runs_with_verified_syncs(tiny_cache, tmp_path, pipeline):
    ctx = make_context(tmp_path, f"pipeline={pipeline}", "model.dtype=bfloat16", "trainer.total_training_steps=2",
                       "trainer.test_freq=0", "trainer.val_before_train=false", "actor.old_log_probs=recompute"
                       if pipeline == "colocated" else "actor.ppo_epochs=1")
    ctx.synchronizer.verify = True
    engine_model = ctx.rollout.workers[0].engine._runner.model
    assert next(engine_model.parameters()).dtype == torch.bfloat16
    asyncio.run(pipeline_module(pipeline).run(ctx))
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) >= 2 and ctx.synchronizer.transfers >= 1
    assert steps[-1]["sync/verify_s"] > 0
    if pipeline == "colocated":
        assert 0 < steps[0]["training/rollout_logprob_diff_mean"] < 0.05
