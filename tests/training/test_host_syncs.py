"""Host reads in the trainer's loops: none per micro-batch, whatever the number of micro-batches.

A host read of a device tensor (`.item()`, `.tolist()`, `float()`, `int()`, `bool()`, use as an
index, `.cpu()`, `.numpy()`) waits for everything queued on the device; inside the micro-batch
loop that stalls the GPU once per micro-batch. On the CPU nothing waits, so the test marks what
would live on the device and counts reads of marked tensors only. The rule (`on_device`,
`Marking`):
- the batch's tensors are marked once its host-side facts (`HostRows`) are read from the CPU
  batch, as `TrainBatch.to` does before moving a batch;
- a torch call's outputs are marked when an input is marked or the call names a device (a
  `device=` argument, `.to(device)`): what the code places beside the model's tensors. Plans
  built from Python numbers without a device stay CPU tensors on a GPU too, so reading them
  costs nothing and does not count; parameters and gradients are not marked.
Each entry point is run with one micro-batch and with several; asyncrl's reads must be the same,
at most the transfers a step makes by design: the metrics once, the gradient norm (whose
finiteness decides the optimizer step) once per optimizer step. transformers' mask preparation
reads once per forward (packed rows: `find_packed_sequence_indices` checks whether the positions
restart; padded rows: whether the padding mask is all ones): those reads are listed apart and
must come from there only (the GPU test lets them through by name).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig, CriticConfig
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import HostRows, TrainBatch, build_batch, micro_batches
from asyncrl.training.critic import Critic
from tests.training.helpers import make_ragged_groups, tiny_lm

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy")
LIBRARY = "site-packages"  # a read in a frame under it is transformers' (or torch's), not asyncrl's
MASKS = "transformers/masking_utils.py"  # where transformers prepares attention masks
ONE, SEVERAL = 10_000, 25  # token budgets: the whole ragged batch (99 real tokens) in one micro-batch, or in 4+
_MARK = "_asyncrl_on_device"


def marked(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, _MARK, False)


def mark(value: Any) -> None:
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor):
            setattr(leaf, _MARK, True)


class Marking(TorchFunctionMode):
    """Marks the outputs of every torch call on a marked input or naming a device."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves = tree_flatten((args, kwargs))[0]
        if kwargs.get("device") is not None or any(marked(x) or isinstance(x, torch.device) for x in leaves):
            mark(out)
        return out


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every host read of a marked tensor while the block runs, as 'read at path:line'."""
    seen: list[str] = []
    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name), name, seen))
        with Marking():
            yield seen


def _counted(original: Any, name: str, seen: list[str]) -> Any:
    inside = [False]  # the torch function mode calls the patched method again: count the outer call

    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if inside[0]:
            return original(self, *args, **kwargs)
        if marked(self):
            frame = sys._getframe(1)
            seen.append(f"{name} at {Path(frame.f_code.co_filename).as_posix()}:{frame.f_lineno}")
        inside[0] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            inside[0] = False

    return read


def ours(reads: list[str]) -> list[str]:
    """The reads made by asyncrl's code (or the tests'), not by a library it calls."""
    return [r for r in reads if LIBRARY not in r]


def library(reads: list[str]) -> list[str]:
    return [r for r in reads if LIBRARY in r]


def on_device(batch: TrainBatch) -> TrainBatch:
    """`batch` as `TrainBatch.to` hands it to a trainer on a device: host facts read from the CPU
    tensors, then every tensor marked."""
    out = replace(batch, host=HostRows.read(batch), extras=dict(batch.extras))
    for f in fields(out):
        mark(getattr(out, f.name))
    mark(list(out.extras.values()))
    return out


def prepared_batch(actor: Actor) -> TrainBatch:
    batch = build_batch(make_ragged_groups(), pad_id=0)
    batch.old_log_probs = actor.compute_log_probs(batch) - 0.05 * batch.response_mask  # ratios != 1
    batch.ref_log_probs = batch.old_log_probs + 0.1 * batch.response_mask
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


def actor_with_budget(budget: int, pack: bool) -> Actor:
    cfg = ActorConfig(ppo_micro_batch_tokens=budget, log_prob_micro_batch_tokens=budget, lr=1e-2,
                      entropy_coeff=0.01, use_kl_loss=True)
    return Actor(tiny_lm(), cfg, temperature=1.0, norm_length=4, use_remove_padding=pack)


def micro_batch_count(batch: TrainBatch, budget: int, pack: bool) -> int:
    return sum(1 for _ in micro_batches(batch, budget, pack))


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_actor_reads_the_host_per_step_not_per_micro_batch(monkeypatch, pack):
    counts = {}
    for budget in (ONE, SEVERAL):
        actor = actor_with_budget(budget, pack)
        batch = prepared_batch(actor)
        here = on_device(batch)
        with counting(monkeypatch) as log_prob_reads:
            actor.compute_log_probs(here)
        with counting(monkeypatch) as step_reads:
            metrics = actor.train_step(here, num_mini_batches=2)
        with counting(monkeypatch) as stream_reads:
            actor.accumulate(here.select(range(6)))
            actor.accumulate(here.select(range(6, batch.size)))
        with counting(monkeypatch) as apply_reads:
            actor.apply_update()
        every = log_prob_reads + step_reads + stream_reads + apply_reads
        assert all(MASKS in r for r in library(every)), library(every)
        counts[budget] = tuple(ours(reads) for reads in (log_prob_reads, step_reads, stream_reads, apply_reads))
        assert {"actor/entropy", "actor/kl_loss", "actor/pg_loss"} <= metrics.keys()
    assert micro_batch_count(batch, ONE, pack) == 1 and micro_batch_count(batch, SEVERAL, pack) >= 4
    assert counts[ONE] == counts[SEVERAL], counts
    log_prob_reads, step_reads, stream_reads, apply_reads = counts[SEVERAL]
    assert log_prob_reads == [] and stream_reads == []
    assert len(step_reads) <= 1 + 2 and len(apply_reads) <= 2  # the metrics, each optimizer step's norm


def test_reference_and_critic_passes_read_nothing_per_micro_batch(monkeypatch):
    counts = {}
    for budget in (ONE, SEVERAL):
        ref = RefWorker(tiny_lm(), temperature=1.0, micro_batch_tokens=budget)
        critic = Critic(tiny_lm(), CriticConfig(lr=1e-2), micro_batch_tokens=budget,
                        forward_micro_batch_tokens=budget, loss_agg_mode="token-mean")
        batch = build_batch(make_ragged_groups(), pad_id=0)
        here = on_device(batch)
        with counting(monkeypatch) as ref_reads:
            ref.compute_log_probs(here)
        with counting(monkeypatch) as value_reads:
            here.values = critic.compute_values(here)
        here.returns = here.values + here.response_mask
        with counting(monkeypatch) as critic_reads:
            metrics = critic.train_step(here, num_mini_batches=2)
        every = ref_reads + value_reads + critic_reads
        assert all(MASKS in r for r in library(every)), library(every)
        counts[budget] = tuple(ours(reads) for reads in (ref_reads, value_reads, critic_reads))
        assert {"critic/vf_loss", "critic/grad_norm"} <= metrics.keys()
    assert counts[ONE] == counts[SEVERAL], counts
    ref_reads, value_reads, critic_reads = counts[SEVERAL]
    assert ref_reads == [] and value_reads == [] and len(critic_reads) <= 1  # the metrics, once


def test_marking_sees_a_read_in_the_loop(monkeypatch):
    """The counter is not blind: a read of a model output per micro-batch is counted per micro-batch."""
    actor = actor_with_budget(SEVERAL, pack=True)
    here = on_device(prepared_batch(actor))
    loss_of = actor._micro_batch_loss

    def reading_loss(mb, counts):
        loss, metrics = loss_of(mb, counts)
        float(loss.detach())
        return loss, metrics

    actor._micro_batch_loss = reading_loss
    with counting(monkeypatch) as reads:
        actor.train_step(here, num_mini_batches=1)
    per_loss = [r for r in reads if "test_host_syncs.py" in r]
    assert len(per_loss) == micro_batch_count(here, SEVERAL, pack=True) >= 4
