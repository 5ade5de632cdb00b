"""The trainer and every pipeline on CUDA (skipped without a GPU): float32 masters on the GPU
under bf16 autocast, results back on the CPU; colocated, one_step_off and fully_async train with
`trainer.device=cuda model.dtype=bfloat16`, every weight sync verified bit for bit."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from asyncrl.config_schema import ActorConfig
from asyncrl.pipelines import pipeline_module
from asyncrl.training.actor import Actor
from tests.pipelines.helpers import make_context, read_jsonl
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_actor_trains_on_cuda_in_bf16_with_float32_masters():
    model = tiny_lm().cuda()
    actor = Actor(model, ActorConfig(lr=1e-2), temperature=1.0, norm_length=4, compute_dtype=torch.bfloat16)
    batch = prepared_batch(model, make_groups(), actor)  # built on the CPU
    assert batch.old_log_probs.device.type == "cpu"
    before = {k: v.clone() for k, v in model.named_parameters()}
    for _ in range(3):
        metrics = actor.train_step(batch, num_mini_batches=1)
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    assert all(t.dtype == torch.bfloat16 and t.is_cuda for t in actor.named_weights().values())


@pytest.mark.parametrize("pipeline", ["colocated", "one_step_off", "fully_async"])
def test_every_pipeline_trains_on_one_gpu(tiny_cache, tmp_path, pipeline):
    ctx = make_context(tmp_path, f"pipeline={pipeline}", "trainer.device=cuda", "model.dtype=bfloat16",
                       "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false")
    ctx.synchronizer.verify = True
    asyncio.run(pipeline_module(pipeline).run(ctx))
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) >= 3 and ctx.synchronizer.transfers >= 1
    assert all(math.isfinite(r["actor/pg_loss"]) for r in steps if "actor/pg_loss" in r)
