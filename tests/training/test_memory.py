"""Gradient checkpointing: the same actor update (same batch, same seed) gives the same loss and
gradients while the peak of CPU tensor memory during the step falls.

Peak memory is read from the profiler's allocator events (`profile_memory=True`: one event per
CPU allocation and free, with its size), summed in time order: deterministic, unlike RSS."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig, ModelConfig
from asyncrl.training.actor import Actor
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.model import prepare_actor_model
from asyncrl.types import Group, PromptRow, Trajectory

VOCAB, PROMPT, RESPONSE = 64, 16, 240


def deep_lm() -> LlamaForCausalLM:
    """Six layers and eager attention: activations, not weights, dominate a step's memory."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=256, attn_implementation="eager")
    return LlamaForCausalLM(cfg)


def long_groups() -> list[Group]:
    g = torch.Generator().manual_seed(0)
    groups = []
    for p in range(2):
        prompt = torch.randint(3, VOCAB, (PROMPT,), generator=g).tolist()
        trajs = [Trajectory(request_id=f"p{p}/{i}", prompt_ids=prompt,
                            response_ids=torch.randint(3, VOCAB, (RESPONSE,), generator=g).tolist(),
                            logprobs=[-4.0] * RESPONSE, versions=[0] * RESPONSE, finish_reason="stop",
                            reward=float(i % 2)) for i in range(4)]
        row = PromptRow(uid=f"p{p}", data_source="t", messages=(), ground_truth="0", prompt_ids=tuple(prompt))
        groups.append(Group(uid=f"p{p}", row=row, trajectories=trajs))
    return groups


def peak_allocated_bytes(fn: Callable[[], object]) -> int:
    """The highest total of CPU bytes allocated and not yet freed while `fn` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def actor_step(checkpointing: bool) -> tuple[int, float, torch.Tensor]:
    """(peak bytes, policy loss, gradients) of one update of a fresh actor on the same batch."""
    model = prepare_actor_model(deep_lm(), ModelConfig(enable_gradient_checkpointing=checkpointing))
    actor = Actor(model, ActorConfig(lr=1e-3, warmup_steps=0, ppo_micro_batch_tokens=1 << 20,
                                       log_prob_micro_batch_tokens=1 << 20),
                  temperature=1.0, norm_length=RESPONSE)
    batch: TrainBatch = build_batch(long_groups(), pad_id=0)
    batch.old_log_probs = actor.compute_log_probs(batch)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    metrics: dict[str, float] = {}
    peak = peak_allocated_bytes(lambda: metrics.update(actor.train_step(batch, num_mini_batches=1)))
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return peak, metrics["actor/pg_loss"], grads


def test_checkpointing_lowers_peak_memory_at_equal_loss_and_gradients():
    plain_peak, plain_loss, plain_grads = actor_step(checkpointing=False)
    ckpt_peak, ckpt_loss, ckpt_grads = actor_step(checkpointing=True)
    assert ckpt_loss == plain_loss  # the forward pass is the same computation
    torch.testing.assert_close(ckpt_grads, plain_grads, rtol=1e-5, atol=1e-7)
    assert ckpt_peak < 0.6 * plain_peak, (ckpt_peak, plain_peak)
