"""The trainer's loops on CUDA never wait for the GPU (skipped without one): the actor's
`train_step`, `accumulate` / `apply_update` and log-prob pass, the reference's and the critic's
passes run under `torch.cuda.set_sync_debug_mode("error")`, which raises at any synchronising
call (a device read, a blocking copy). Two calls run with the mode off and are counted: the one
designed transfer, `to_host` (the metrics once per step, the gradient norm once per optimizer
step, which decides the step), whose count depends on the optimizer steps, not on the
micro-batches; and transformers' `create_causal_mask`, which reads the device once per forward
(whether packed positions restart, whether a padding mask is all ones) before asyncrl's attention
sees the call: the one read per micro-batch left, outside asyncrl.

The batch is moved to the GPU first (`TrainBatch.to`, its host-side facts read on the CPU), as a
trainer does on entry; the loops then plan from those facts and copy their indices from pinned
memory, asynchronously. The CPU twin, tests/training/test_host_syncs.py, counts the reads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from transformers.models.llama import modeling_llama

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig, CriticConfig
from asyncrl.training import actor as actor_module
from asyncrl.training import batch as batch_module
from asyncrl.training import critic as critic_module
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import TrainBatch, build_batch, micro_batches
from asyncrl.training.critic import Critic
from tests.training.helpers import make_ragged_groups, tiny_lm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BUDGET = 40  # tokens: the ragged batch in 4+ micro-batches


@contextmanager
def sync_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Synchronising calls raise while the block runs, but in `to_host` and transformers' mask
    creation; their calls are counted by name."""
    calls = {"to_host": 0, "create_causal_mask": 0}

    def allowed(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[fn.__name__] += 1
            torch.cuda.set_sync_debug_mode(0)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error")

        return call

    for module in (actor_module, critic_module):
        monkeypatch.setattr(module, "to_host", allowed(batch_module.to_host))
    monkeypatch.setattr(modeling_llama, "create_causal_mask", allowed(modeling_llama.create_causal_mask))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield calls
    finally:
        torch.cuda.set_sync_debug_mode(0)


def prepared_batch(actor: Actor) -> TrainBatch:
    batch = build_batch(make_ragged_groups(), pad_id=0)
    batch.old_log_probs = actor.compute_log_probs(batch) - 0.05 * batch.response_mask
    batch.ref_log_probs = batch.old_log_probs + 0.1 * batch.response_mask
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_actor_loops_never_wait_for_the_gpu(monkeypatch, pack):
    cfg = ActorConfig(ppo_micro_batch_tokens=BUDGET, log_prob_micro_batch_tokens=BUDGET, lr=1e-2,
                      entropy_coeff=0.01, use_kl_loss=True)
    actor = Actor(tiny_lm().cuda(), cfg, temperature=1.0, norm_length=4, compute_dtype=torch.bfloat16,
                  use_remove_padding=pack)
    here = prepared_batch(actor).to(torch.device("cuda", torch.cuda.current_device()))
    assert sum(1 for _ in micro_batches(here, BUDGET, pack)) >= 4
    with sync_errors(monkeypatch) as transfers:
        log_probs = actor.compute_log_probs(here)
        metrics = actor.train_step(here, num_mini_batches=2)
        actor.accumulate(here.select(range(6)))
        actor.accumulate(here.select(range(6, here.size)))
        streamed = actor.apply_update()
    # train_step: 2 optimizer steps' norms + the metrics; apply_update: 1 norm + the metrics
    assert transfers["to_host"] == 2 + 1 + 1 + 1
    assert log_probs.is_cuda and torch.isfinite(log_probs).all()
    assert metrics.keys() == streamed.keys() and {"actor/entropy", "actor/kl_loss"} <= metrics.keys()


def test_reference_and_critic_passes_never_wait_for_the_gpu(monkeypatch):
    device = torch.device("cuda", torch.cuda.current_device())
    ref = RefWorker(tiny_lm().cuda(), temperature=1.0, micro_batch_tokens=BUDGET, compute_dtype=torch.bfloat16)
    critic = Critic(tiny_lm().cuda(), CriticConfig(lr=1e-2), micro_batch_tokens=BUDGET,
                    forward_micro_batch_tokens=BUDGET, loss_agg_mode="token-mean", compute_dtype=torch.bfloat16)
    here = build_batch(make_ragged_groups(), pad_id=0).to(device)
    with sync_errors(monkeypatch) as transfers:
        ref_log_probs = ref.compute_log_probs(here)
        here.values = critic.compute_values(here)
        here.returns = here.values + here.response_mask
        metrics = critic.train_step(here, num_mini_batches=2)
    assert transfers["to_host"] == 1  # the critic's metrics, once
    assert ref_log_probs.is_cuda and {"critic/vf_loss", "critic/grad_norm"} <= metrics.keys()
