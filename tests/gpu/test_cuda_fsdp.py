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
from tests.tolerances import Lockstep, assert_same_steps, flat, state_dicts
from tests.training.helpers import gradient_terms, tiny_lm
from tests.training.test_fsdp import BUDGET, prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


LR = 1e-2


def one_step(shard: bool) -> tuple[Lockstep, torch.Tensor]:
    """The step as recorded (full gradient and weights, tests/tolerances.py) and the full weights
    `fsdp.full_tensors` gives a sync afterwards, flat."""
    model = tiny_lm().cuda()
    if shard:
        fsdp.shard(model)
    actor = Actor(model, config(), temperature=1.0, norm_length=4)
    record = Lockstep()
    record.attach(actor.model, actor.optimizer, save=fsdp.full_state_dicts if shard else state_dicts)
    actor.train_step(prepared_batch(), num_mini_batches=1)
    named = fsdp.full_tensors(model) if shard else actor.named_weights()
    return record, flat(named.values())


def config() -> ActorConfig:
    return ActorConfig(ppo_micro_batch_tokens=BUDGET, lr=LR, warmup_steps=0)


def test_fully_shard_at_world_size_one_steps_like_the_plain_model():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        sharded, synced = one_step(shard=True)
    finally:
        dist.destroy_process_group()
    plain, _ = one_step(shard=False)
    # One step from the same weights: gradients within their float32 summation bound, weights
    # within what AdamW makes of it plus rounding (tests/tolerances.py).
    tokens = int(prepared_batch().response_mask.sum())
    assert_same_steps(sharded.steps, plain.steps, [gradient_terms(config(), tokens)], LR)
    torch.testing.assert_close(synced, sharded.steps[0].weights, rtol=0, atol=0)  # the sync sees the step
