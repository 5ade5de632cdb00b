"""The actor and reference workers: a causal LM, its optimizer, log-probs and PPO updates.

`Actor.train_step(batch, num_mini_batches)` runs `ppo_epochs` x mini-batches x token-budget
micro-batches (length-sorted and trimmed of padding, see `asyncrl.training.batch`), scaling each
micro-batch's loss so the accumulated gradient equals the mini-batch's aggregate (exact for
every `loss_agg_mode`). Losses come from the pure `asyncrl.algorithms`; this module owns state
(model, optimizer, schedule), not math. Every term (policy loss, KL, entropy) and every count
runs over the batch's `loss_mask`: a multi-turn episode's tool text is read as context, never
trained, and what sits at its positions (log-probs, advantages, weights) reaches no gradient.

The stream trainer's mode, "gradients now, step later": `accumulate(chunk)` backpropagates the
chunk's loss *sum* (every agg mode's numerator: the aggregate with denominators of 1), and
`apply_update()` divides the summed gradients by the whole batch's count (tokens for token-mean,
sequences for the seq-mean-* modes), then clips and steps once. The result is the plain one-
mini-batch `train_step` on the concatenated chunks, up to float rounding. Gradients pending
between the two calls are not checkpointed.

The learning rate follows `asyncrl.training.optim.LRSchedule` (warm-up, then constant or
cosine), stepped once per optimizer step; `total_steps` (all optimizer steps of the run) is what
the cosine and a warm-up ratio need. A LoRA model (`asyncrl.training.lora`) trains its adapters
only; `named_weights` then gives the merged weights under the base names, and checkpoints hold
both the merged model and the adapters.

Inside a torch.distributed process group of more than one rank the actor trains data-parallel
with FSDP2 (`asyncrl.training.fsdp`): every rank holds the whole batch and runs its rows of each
micro-batch, gradients are summed across ranks, and the update equals the single-process one up
to float rounding. `named_weights`, `compute_log_probs`, `save` and `load` are then collective:
every rank calls them. LoRA is not supported sharded.

With `use_remove_padding` (the default) each micro-batch's rows run as one padding-free sequence
(`asyncrl.training.packing`, each row's attention within itself through
`asyncrl.training.packed_attention`), planned by real tokens; results come back in the padded
(B, T) layout, so the losses are the same. The reference worker and the critic take the same
switch.

Devices and precision: the model (float32 master weights, and so float32 optimizer state)
lives on its device; each entry point moves the batch it is handed there and returns results on
the batch's device. The micro-batch loop reads nothing back from the device: plans come from the
batch's host-side facts (`asyncrl.training.batch.HostRows`), metrics stay device tensors (float64
sums) and reach the host in one transfer per step (`to_host`), and one more read per optimizer
step takes the gradient norm, whose finiteness decides the step. With
`compute_dtype=torch.bfloat16` the `mixed_precision` path (`asyncrl.training.precision`) runs:
bf16 parameters over float32 masters (FSDP2's policy; the default) or autocast over
float32 parameters; log-probs, entropies and losses are float32 math either way, and
`named_weights` gives bf16 copies of the float32 masters, what the rollout engines hold.

It does not know about pipelines or engines, and starts no processes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.algorithms.agg import agg_loss
from asyncrl.algorithms.kl import kl_penalty
from asyncrl.algorithms.policy_loss import _FORCED_AGG_MODE, compute_policy_loss
from asyncrl.config.schema import ActorConfig
from asyncrl.models.tensors import export_named
from asyncrl.state_io import check_weights, load_state, read_tensors, save_state
from asyncrl.training import fsdp, packing
from asyncrl.training.batch import (
    Metrics,
    TrainBatch,
    host_rows,
    map_micro_batches,
    mean_over_mini_batches,
    micro_batches,
    to_host,
)
from asyncrl.training.logits import response_log_probs, response_logits
from asyncrl.training.lora import is_lora, load_lora, merged_named, save_lora
from asyncrl.training.optim import actor_schedule, make_optimizer, seed_state, set_seed_state
from asyncrl.training.precision import Precision, cast_params, weights_for
from asyncrl.training.vocab_chunks import choose_head

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

# Ratio-like metrics are averaged over micro-batches by row share; loss-like ones are already
# shares of the mini-batch aggregate (global counts) and are summed.
_AVERAGED = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/kl_coef")

# Denominators of 1 turn every agg mode into its numerator: the chunk's loss sum.
_SUMS = {"global_token_count": 1.0, "global_seq_count": 1.0}
ACTOR_STATE = "actor_state.json"
"""The optimizer, schedule, version and RNG state (tensors beside it in actor_state.safetensors)."""


@dataclass
class _Accumulated:
    """What `Actor.accumulate` has added since the last step: counts and metric sums."""

    tokens: float = 0.0
    seqs: float = 0.0
    rows: int = 0
    metrics: Metrics = field(default_factory=lambda: defaultdict(float))

    def add(self, batch: TrainBatch, metrics: Metrics) -> None:
        counts = _counts(batch)
        self.tokens += counts["global_token_count"]
        self.seqs += counts["global_seq_count"]
        self.rows += batch.size
        for k, v in metrics.items():
            self.metrics[k] = self.metrics[k] + v

    def count(self, mode: str) -> float:
        """The whole batch's denominator of `mode` (never below 1, as in `agg_loss`)."""
        return max(self.tokens if mode == "token-mean" else self.seqs, 1.0)


def _counts(batch: TrainBatch) -> dict[str, float]:
    """Response tokens and non-empty sequences of `batch`, as `agg_loss`'s global counts (from
    its host-side facts: no device read)."""
    host = host_rows(batch)
    return {"global_token_count": host.tokens(), "global_seq_count": host.sequences()}


def _trained(batch: TrainBatch, values: torch.Tensor) -> torch.Tensor:
    """`values` (B, T) with 0 at the tool tokens: what sits there (even NaN) then reaches no
    gradient through a term that `agg_loss` masks afterwards. Single turn: `values` as they are."""
    return torch.where(batch.loss_mask.bool(), values, 0.0) if batch.has_context_tokens else values


def _f64(value: torch.Tensor | float) -> torch.Tensor | float:
    """A metric as a float64 term of a sum (a device tensor stays there), as Python sums floats."""
    return value.detach().double() if isinstance(value, torch.Tensor) else value


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class RefWorker:
    """A frozen policy: per-token log-probs only (for KL terms). Under "param_dtype" its
    parameters are held in bf16 alone: it never steps, so it keeps no float32 masters."""

    def __init__(self, model: nn.Module, temperature: float, micro_batch_tokens: int,
                 compute_dtype: torch.dtype = torch.float32, use_remove_padding: bool = True,
                 mixed_precision: str = "auto") -> None:
        self.model = model.eval().requires_grad_(False)
        self.temperature = temperature
        self.micro_batch_tokens = micro_batch_tokens
        self.precision = Precision.choose(mixed_precision, compute_dtype)
        if self.precision.param_dtype is not None:
            cast_params(model, self.precision.param_dtype)
        self.pack = use_remove_padding
        if self.pack:
            packing.enable_packing(model)
        self.head = choose_head(model)  # log-probs from full logits or over vocabulary chunks

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        here = batch.to(model_device(self.model))
        out = map_micro_batches(here, self.micro_batch_tokens, self._log_probs, self.pack) * here.loss_mask
        return out.to(batch.responses.device)

    def _log_probs(self, mb: TrainBatch) -> torch.Tensor:
        return response_log_probs(self.model, mb, self.temperature, self.precision.autocast_dtype, self.pack,
                                  self.head.chunked)


class Actor:
    """Model (full or LoRA) + AdamW (warm-up, constant or cosine) + PPO-style update."""

    def __init__(self, model: PreTrainedModel | PeftModel, cfg: ActorConfig, *, temperature: float,
                 norm_length: int, total_steps: int = 0, compute_dtype: torch.dtype = torch.float32,
                 use_remove_padding: bool = True, mixed_precision: str = "auto") -> None:
        self.sharded = fsdp.is_sharded()
        self.precision = Precision.choose(mixed_precision, compute_dtype)
        if self.sharded:
            assert not is_lora(model), \
                "LoRA with FSDP (a process group of several ranks) is not supported: set model.lora_rank=0"
            fsdp.shard(model, self.precision.param_dtype)
        self.weights = weights_for(model, self.precision, self.sharded)  # where the float32 masters live
        self.model = model
        self.cfg = cfg
        self.temperature = temperature
        self.norm_length = norm_length
        self.schedule = actor_schedule(cfg, total_steps)
        self.optimizer, self.scheduler = make_optimizer(self.weights.trainable(), cfg.lr, cfg.weight_decay, cfg.betas,
                                                        self.schedule)
        self.weights.attach(self.optimizer)
        self.pack = use_remove_padding
        if self.pack:  # after the optimizer: FSDP2 leaves the root unsharded after a no-grad forward
            packing.enable_packing(model)
        self.head = choose_head(model)  # log-probs and entropies from full logits or vocabulary chunks
        self.version = 0
        self._last_lr = float(self.scheduler.get_last_lr()[0])
        self._pending: _Accumulated | None = None

    def named_weights(self) -> dict[str, torch.Tensor]:
        """What the rollout engines load: every parameter under the base model's names (LoRA
        merged), detached; tensors not merged are not copied. Sharded: full copies (collective).
        Below float32: the float32 masters cast once, whichever precision path trains them."""
        with self.weights.at_masters():
            if self.sharded:
                named = fsdp.full_tensors(self.model)
            else:
                named = merged_named(self.model) if is_lora(self.model) else export_named(self.model)
            dtype = self.precision.dtype
            if dtype == torch.float32:
                return named
            return {k: v.to(dtype) if v.is_floating_point() else v for k, v in named.items()}

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        here = batch.to(self._device())
        map_rows = fsdp.map_rank_micro_batches if self.sharded else map_micro_batches
        out = map_rows(here, self.cfg.log_prob_micro_batch_tokens, self._log_probs, self.pack) * here.loss_mask
        return out.to(batch.responses.device)

    def _log_probs(self, mb: TrainBatch) -> torch.Tensor:
        return response_log_probs(self.model, mb, self.temperature, self.precision.autocast_dtype, self.pack,
                                  self.head.chunked)

    def train_step(self, batch: TrainBatch, num_mini_batches: int) -> dict[str, float]:
        """PPO epochs over mini-batches; one optimizer step per mini-batch."""
        assert batch.advantages is not None
        assert batch.old_log_probs is not None or (self.cfg.ppo_epochs == 1 and num_mini_batches == 1), \
            "old log-probs from the update's own forward need one optimizer step per batch"
        metrics = mean_over_mini_batches(batch.to(self._device()), self.cfg.ppo_epochs, num_mini_batches,
                                         self._mini_batch_step)
        self.version += 1
        return to_host(metrics) | {"actor/lr": self._last_lr}

    def accumulate(self, batch: TrainBatch) -> None:
        """Add the gradient of this chunk's loss sum (unnormalised; see the module docstring).
        Weights do not change until `apply_update`."""
        assert batch.advantages is not None
        self._pg_mode()  # fail before any backward when the terms cannot share one denominator
        if self._pending is None:
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = _Accumulated()
        batch = batch.to(self._device())
        self._pending.add(batch, self._backward(batch, _SUMS, rows=1))

    def apply_update(self) -> dict[str, float]:
        """Divide the accumulated gradients by the batch's count, clip, step once; the metrics
        `train_step` returns for the same batch."""
        assert self._pending is not None, "apply_update without accumulate: no gradients to apply"
        acc, self._pending = self._pending, None
        total = acc.count(self._pg_mode())
        for param in self._trainable():  # the masters' gradients where they are apart
            if param.grad is not None:
                param.grad.div_(total)
        metrics = {k: v / self._metric_count(k, acc) for k, v in acc.metrics.items()}
        metrics["actor/grad_norm"] = self._clip_and_step()
        self.version += 1
        return to_host(metrics) | {"actor/lr": self._last_lr}

    def _pg_mode(self) -> str:
        """The policy loss's agg mode (gspo forces its own), which must be every gradient term's."""
        mode = _FORCED_AGG_MODE.get(self.cfg.policy_loss, self.cfg.loss_agg_mode)
        assert mode == self.cfg.loss_agg_mode or not (self.cfg.entropy_coeff or self.cfg.use_kl_loss), (
            f"actor.policy_loss={self.cfg.policy_loss} aggregates by {mode}: set actor.loss_agg_mode={mode} "
            "to accumulate it with an entropy or KL loss")
        return mode

    def _metric_count(self, key: str, acc: _Accumulated) -> float:
        if key in _AVERAGED:
            return float(max(acc.rows, 1))
        return acc.count(self._pg_mode() if key == "actor/pg_loss" else self.cfg.loss_agg_mode)

    def _mini_batch_step(self, mini: TrainBatch) -> Metrics:
        assert self._pending is None, "train_step between accumulate and apply_update"
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self._backward(mini, _counts(mini), rows=mini.size)
        metrics["actor/grad_norm"] = self._clip_and_step()
        return metrics

    def _backward(self, batch: TrainBatch, counts: dict[str, float], rows: int) -> Metrics:
        """Backward of each micro-batch's loss over `counts`: loss-like metrics summed, ratio-like
        ones (token means) weighted by micro-batch rows / `rows`; sharded: each rank's part by its
        share of the micro-batch's tokens, then summed over the ranks. Sums stay on the device."""
        self.model.train()
        metrics: Metrics = defaultdict(float)
        for mb_rows, mb, mean_rows in self._micro_batches(batch):
            # Each micro-batch loss is its share of the aggregate over `counts` (global counts), so
            # the summed gradients equal one pass over the whole batch for every agg mode, whatever
            # the rows' grouping, order and rank (micro-batches are length-sorted and trimmed).
            loss, mb_metrics = self._micro_batch_loss(mb, counts)
            # No rows: a sharded rank's stand-in row, run for the collectives and counted as nothing.
            (loss if mb_rows else loss * 0.0).backward()
            for k, v in mb_metrics.items():
                metrics[k] = metrics[k] + _f64(v) * (mean_rows / rows if k in _AVERAGED else float(bool(mb_rows)))
        return fsdp.all_reduce_sum(metrics, self._device()) if self.sharded else metrics

    def _micro_batches(self, batch: TrainBatch) -> Iterator[tuple[list[int], TrainBatch, float]]:
        """(rows, micro-batch, weight of its token means in rows); sharded: this rank's part of
        each (`fsdp.rank_micro_batches`)."""
        budget = self.cfg.ppo_micro_batch_tokens
        if self.sharded:
            return fsdp.rank_micro_batches(batch, budget, self.pack)
        return ((rows, mb, float(len(rows))) for rows, mb in micro_batches(batch, budget, self.pack))

    def _device(self) -> torch.device:
        return model_device(self.model)

    def _clip_and_step(self) -> float:
        """Clip, step the optimizer (skipped on a non-finite norm) and the schedule; the norm.
        `actor/lr` reports the rate this (last) step used, as verl logs it."""
        # sharded: the norm of the full gradient (a DTensor over the ranks' shards); its finiteness
        # decides the step, the one host read of an optimizer step
        norm = fsdp.full_norm(nn.utils.clip_grad_norm_(self._trainable(), self.cfg.grad_clip))
        grad_norm = to_host({"actor/grad_norm": norm})["actor/grad_norm"]
        self._last_lr = float(self.scheduler.get_last_lr()[0])
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        return grad_norm

    def _micro_batch_loss(self, mb: TrainBatch, counts: dict[str, float]) -> tuple[torch.Tensor, Metrics]:
        cfg = self.cfg
        assert mb.advantages is not None
        out = response_logits(self.model, mb, self.precision.autocast_dtype, self.pack,
                              self.temperature if self.head.chunked else None)
        log_prob = out.log_probs(self.temperature)
        # None: this forward runs on the weights that generated the batch (one optimizer step
        # per batch, see `train_step`), so its log-probs, detached, are the old ones exactly.
        old = log_prob.detach() * mb.loss_mask if mb.old_log_probs is None else mb.old_log_probs
        loss, pg_metrics = compute_policy_loss(
            cfg.policy_loss, old, log_prob, mb.advantages, mb.loss_mask,
            loss_agg_mode=cfg.loss_agg_mode, clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
            is_weights=mb.is_weights, norm_length=self.norm_length, **counts)
        # at the sampling temperature, as the log-probs (and verl's entropy) are
        entropy = self._agg(out.entropies(self.temperature, grad=bool(cfg.entropy_coeff)), mb, counts)
        metrics: Metrics = {**pg_metrics, "actor/entropy": entropy.detach()}
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * entropy
        if cfg.use_kl_loss:
            assert mb.ref_log_probs is not None, "actor.use_kl_loss needs reference log-probs"
            kl_T = kl_penalty(_trained(mb, log_prob), _trained(mb, mb.ref_log_probs), cfg.kl_loss_type)
            kl = self._agg(kl_T, mb, counts)
            loss = loss + cfg.kl_loss_coef * kl
            metrics |= {"actor/kl_loss": kl.detach(), "actor/kl_coef": cfg.kl_loss_coef}
        return loss, metrics

    def _agg(self, values: torch.Tensor, mb: TrainBatch, counts: dict[str, float]) -> torch.Tensor:
        return agg_loss(values, mb.loss_mask, self.cfg.loss_agg_mode, norm_length=self.norm_length, **counts)

    def _trainable(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def save(self, path: Path) -> None:
        """HF format (LoRA: merged, plus the adapters in `lora_adapter/`) and the optimizer,
        schedule, version and RNG state in actor_state.json + .safetensors (`asyncrl.state_io`).
        Sharded: the same files, of the full state, written by rank 0 (collective). The weights
        are the float32 masters on every path."""
        path.mkdir(parents=True, exist_ok=True)
        model_sd, optim_sd = (fsdp.full_state_dicts(self.model, self.optimizer) if self.sharded
                              else (None, self.optimizer.state_dict()))
        if fsdp.world()[0] == 0:
            with self.weights.at_masters():
                if is_lora(self.model):
                    save_lora(self.model, path)
                else:
                    self.model.save_pretrained(str(path), state_dict=model_sd)
            save_state({"optimizer": optim_sd, "scheduler": self.scheduler.state_dict(),
                        "version": self.version, "rng": seed_state()}, path / ACTOR_STATE)
        if self.sharded:
            dist.barrier()  # the files are complete before any rank reads them

    def load(self, path: Path) -> None:
        """A checkpoint of `save`, single-process or sharded, into this actor (sharded: every rank
        reads the files; collective). Reads JSON and safetensors only; weights that are not
        finite, or a matrix of them all zero, are refused (`state_io.check_weights`)."""
        extra = load_state(path / ACTOR_STATE)
        weights = read_tensors(path / "model.safetensors")
        check_weights(weights, path / "model.safetensors")
        if self.sharded:
            fsdp.load_full_state_dicts(self.model, self.optimizer, weights, extra["optimizer"])
        else:
            with self.weights.at_masters(write=True):  # into the float32 masters, then their working copy
                if is_lora(self.model):
                    load_lora(self.model, path)  # the merged model.safetensors would add the adapters twice
                else:
                    self.model.load_state_dict(weights, strict=False)
            self.optimizer.load_state_dict(extra["optimizer"])
        self.scheduler.load_state_dict(extra["scheduler"])
        self.version = extra["version"]
        set_seed_state(extra["rng"])
