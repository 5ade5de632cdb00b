"""Micro-batch budgets and out-of-memory errors on a real device (skipped without a GPU): the
activation model (`scheduling.micro_budget`) bounds what a Qwen2-0.5B-shaped bf16 update holds
per token, so a step at the budget sized for a 24 GiB share stays within it; a real torch
out-of-memory error in an update leaves the trainer as `OutOfMemory`, one line."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.config.schema import ActorConfig, AlgorithmConfig
from asyncrl.errors import OutOfMemory
from asyncrl.scheduling.micro_budget import (
    GiB,
    ModelShape,
    TrainerDevice,
    TrainerLoad,
    activation_bytes_per_token,
    cuda_micro_batch_tokens,
    model_state_bytes,
)
from asyncrl.training.actor import Actor
from asyncrl.workers.trainer import PPOTrainer
from tests.training.helpers import groups_of_lengths, tiny_lm
from tests.training.test_actor import prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)


def test_an_update_at_the_sized_budget_stays_within_the_memory_model():
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B))
    shape = ModelShape.from_hf(model.config)
    assert shape is not None
    load = TrainerLoad(compute_bytes=2)
    budget = cuda_micro_batch_tokens(TrainerDevice(24 * GiB, shape), 0.0, load)
    assert budget == 4096  # (24 GiB - 8,891,301,888 - 2 GiB) x 0.8 / 2,546,176 = 4,628
    actor = Actor(model, ActorConfig(ppo_micro_batch_tokens=budget, log_prob_micro_batch_tokens=2 * budget,
                                     lr=1e-6, warmup_steps=0), temperature=1.0, norm_length=448,
                  compute_dtype=torch.bfloat16, mixed_precision="autocast")  # the path this load models
    batch = prepared_batch(model, groups_of_lengths([64, 64], [[448] * 4, [448] * 4]), actor)  # 8 x 512 tokens
    actor.train_step(batch, num_mini_batches=1)  # the optimizer's state exists from here on
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    actor.train_step(batch, num_mini_batches=1)
    activations = torch.cuda.max_memory_allocated() - held
    assert held <= model_state_bytes(shape, load)
    assert activations <= budget * activation_bytes_per_token(shape, compute_bytes=2, checkpointing=False), \
        f"{activations / budget:.0f} B per token"


def test_torch_running_out_in_an_update_is_out_of_memory():
    model = tiny_lm().cuda()
    actor = Actor(model, ActorConfig(ppo_micro_batch_tokens=1 << 20, log_prob_micro_batch_tokens=1 << 20),
                  temperature=1.0, norm_length=4096)
    trainer = PPOTrainer(actor, AlgorithmConfig(), pad_id=0, old_log_prob_source="update")
    groups = groups_of_lengths([64, 64], [[4096] * 8, [4096] * 8])  # 16 rows of 4160 tokens in one micro-batch
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 16 * 2**20) / total)
    try:
        with pytest.raises(OutOfMemory, match=r"^out of device memory in the update \(tried to allocate"):
            asyncio.run(trainer.train_groups(groups))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
