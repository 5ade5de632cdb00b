"""FSDP2 (`fully_shard`) on the GPU with world size 1 (skipped without CUDA): the sharded model
(one NCCL rank) takes the same optimizer step as the plain one, and its full weights come back
for a sync. The multi-rank behaviour is tested on 2 CPU ranks over gloo (tests/training)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from asyncrl.config.schema import ActorConfig
from asyncrl.training import fsdp
from asyncrl.training.actor import Actor
from tests.training.helpers import tiny_lm
from tests.training.test_fsdp import BUDGET, prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def trained_weights(shard: bool) -> dict[str, torch.Tensor]:
    model = tiny_lm().cuda()
    if shard:
        fsdp.shard(model)
    cfg = ActorConfig(ppo_micro_batch_tokens=BUDGET, lr=1e-2, warmup_steps=0)
    actor = Actor(model, cfg, temperature=1.0, norm_length=4)
    actor.train_step(prepared_batch(), num_mini_batches=1)
    named = fsdp.full_tensors(model) if shard else actor.named_weights()
    return {k: v.detach().float().cpu() for k, v in named.items()}


def test_fully_shard_at_world_size_one_steps_like_the_plain_model():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        sharded = trained_weights(shard=True)
    finally:
        dist.destroy_process_group()
    torch.manual_seed(0)
    plain = trained_weights(shard=False)
    assert sharded.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(sharded[name], plain[name], rtol=1e-5, atol=1e-6)
