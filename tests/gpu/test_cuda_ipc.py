"""Two processes on one GPU: weights through a CUDA IPC buffer, and the decoupled pipelines with
the trainer and the engine in their own processes (backend=processes)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from asyncrl.pipelines import pipeline_module
from tests.pipelines.helpers import make_context, read_jsonl
from tests.sync.test_shared import test_ipc_syncs_weights_between_processes_bit_for_bit as ipc_sync

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_ipc_syncs_cuda_weights_between_processes_bit_for_bit():
    ipc_sync("cuda")


@pytest.mark.parametrize("pipeline", ["one_step_off", "fully_async"])
def test_decoupled_pipelines_share_one_gpu_as_two_processes(tiny_cache, tmp_path, pipeline):
    ctx = make_context(tmp_path, "backend=processes", f"pipeline={pipeline}", "trainer.device=cuda",
                       "model.dtype=bfloat16", "trainer.total_training_steps=3", "trainer.test_freq=0",
                       "trainer.val_before_train=false")
    ctx.synchronizer.verify = True
    asyncio.run(pipeline_module(pipeline).run(ctx))
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) >= 3 and ctx.synchronizer.transfers >= 2
    assert all(math.isfinite(r["actor/pg_loss"]) for r in steps if "actor/pg_loss" in r)
