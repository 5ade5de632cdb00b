"""Data-parallel training with FSDP2 (`torch.distributed.fsdp.fully_shard`, torch 2.6+).

The actor shards its model when it runs in an initialised process group of more than one rank
(gloo on CPU, NCCL on GPUs). What each rank does:

- `shard(model, param_dtype)`: every decoder layer, then the root, becomes an FSDP unit:
  parameters, gradients and optimizer state are split across the ranks and gathered one layer at
  a time; with `param_dtype` (bf16) under `MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)`:
  the gathered parameters and so the forward and backward run in bf16, gradients are reduced in
  float32 into the float32 shards the optimizer steps (`training.precision`).
- Every rank holds the whole batch. Micro-batches are planned on the whole mini-batch (the same
  plan on every rank) and each rank runs its rows of each (`rank_micro_batches`): every rank
  makes the same number of forward/backward calls, as FSDP's per-layer collectives need. A rank
  with no rows in a micro-batch runs one row and counts it as nothing (loss and metrics x 0).
- Each micro-batch's loss is its share of the *whole* mini-batch's aggregate (global token and
  sequence counts), so gradients are summed across ranks, not averaged (divide factor 1): the
  sum is the mini-batch's gradient for every `loss_agg_mode`, whatever the rows per rank.
- Metrics are summed across ranks the same way (`all_reduce_sum`), log-probs put back in row
  order (`map_rank_micro_batches`), weights exported as full tensors (`full_tensors`) and
  checkpoints written as full state dicts in the single-process format (`full_state_dicts`).

Tested on 2 CPU processes over gloo against the single-process step (tests/training/test_fsdp.py).
Not here: starting the ranks (torchrun or a Ray group does) and choosing which one talks to the
pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.training.batch import Metrics, TrainBatch, fill_rows, host_rows, micro_batches


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_sharded() -> bool:
    return world()[1] > 1


def shard(model: nn.Module, param_dtype: torch.dtype | None = None) -> nn.Module:
    """FSDP2 units: each decoder layer (`model.model.layers`, or the first `nn.ModuleList` of
    blocks), then the root (embeddings, tied head); gradients summed across ranks. `param_dtype`:
    parameters gathered in it for the forward and backward, gradients reduced in float32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in _blocks(model):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if hasattr(module, "set_force_sum_reduction_for_comms"):  # torch 2.8+
                # a plain SUM: gloo has no PREMUL_SUM, and a factor of 1 needs no scaling
                module.set_force_sum_reduction_for_comms(True)
    return model


def _blocks(model: nn.Module) -> Iterator[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if isinstance(layers, nn.ModuleList):
        yield from layers
        return
    for module in model.modules():  # other architectures: the first list of blocks
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            yield from module
            return


def rank_micro_batches(batch: TrainBatch, token_budget: int,
                       packed: bool = False) -> Iterator[tuple[list[int], TrainBatch, float]]:
    """This rank's part of each micro-batch of the whole batch's plan (`micro_batches`, `packed`
    or not): (its rows of `batch`, the micro-batch cut to them, the part's weight in rows),
    every world-th row from its rank's.

    The weight is what the part's token means (clip fraction, ppo_kl) count for in a
    row-weighted average over micro-batches: the micro-batch's rows x the part's share of its
    response tokens, so the ranks' weighted means add up to the whole micro-batch's mean.
    A rank with no rows in a micro-batch gets `([], the micro-batch's first row, 0.0)`: it runs
    that row and discards the result. Example, 2 ranks, plan [[4, 1, 7], [2]]: rank 0 gets
    ([4, 7], ..) and ([2], ..); rank 1 gets ([1], ..) and ([], row 2 as a stand-in, 0.0)."""
    rank, size = world()
    for rows, mb in micro_batches(batch, token_budget, packed):
        mine = list(range(rank, len(rows), size))
        part = mb.sliced(slice(rank, None, size) if mine else slice(0, 1))  # views
        tokens = host_rows(mb).tokens()
        share = host_rows(part).tokens() / tokens if tokens else len(mine) / len(rows)
        yield [rows[i] for i in mine], part, len(rows) * share if mine else 0.0


def map_rank_micro_batches(batch: TrainBatch, token_budget: int, fn: Callable[[TrainBatch], torch.Tensor],
                           packed: bool = False) -> torch.Tensor:
    """`map_micro_batches` across the ranks: each runs `fn` on its rows of every micro-batch; the
    results, in the batch's row order on every rank (each row is one rank's, zeros elsewhere, so
    a sum gathers them exactly). # (B, T)"""
    parts = ((rows, mb) for rows, mb, _ in rank_micro_batches(batch, token_budget, packed))
    out = fill_rows(batch, parts, fn)
    dist.all_reduce(out)
    return out


def all_reduce_sum(values: Mapping[str, torch.Tensor | float], device: torch.device) -> Metrics:
    """Each metric summed over the ranks (same keys on every rank), in one collective; the sums
    stay on `device` (float64)."""
    if not is_sharded() or not values:
        return dict(values)
    keys = sorted(values)
    total = torch.stack([_on(values[k], device) for k in keys])
    dist.all_reduce(total)
    return dict(zip(keys, total.unbind(), strict=True))


def _on(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """A float64 0-dim tensor on `device`; a float is filled in there, not copied from the host."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, torch.float64)
    return torch.full((), value, dtype=torch.float64, device=device)


def full_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter by name as a full (unsharded) tensor, each tied one once; collective:
    every rank calls it."""
    from torch.distributed.tensor import DTensor

    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach()
            for name, p in model.named_parameters()}


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm that may be a DTensor (sharded parameters) as a plain tensor."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) full state dicts on rank 0 (on CPU; empty on the other ranks), the
    optimizer's keyed by position as `optimizer.state_dict()` keys it, so a single-process
    actor loads the checkpoint. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=options)
    if not optim_sd:
        return model_sd, {}
    position = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
    position |= {alias: position[name] for alias, name in _aliases(model).items() if name in position}
    return model_sd, _rekey(dict(optim_sd), position)


def load_full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any],
                          optim_sd: dict[str, Any]) -> None:
    """Load full state dicts (every rank holds them; the optimizer's keyed by position, as
    `full_state_dicts` writes it) into the sharded model and optimizer. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # not strict: a checkpoint leaves out tied weights (the head), which load with their twin
    set_model_state_dict(model, model_sd, options=StateDictOptions(full_state_dict=True, strict=False))
    name = dict(enumerate(_optimizer_names(model, optimizer)))
    set_optimizer_state_dict(model, optimizer, _rekey(optim_sd, name),
                             options=StateDictOptions(full_state_dict=True))


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer slot, in `optimizer.state_dict()`'s order."""
    name_of = {param: name for name, param in model.named_parameters()}
    return [name_of[p] for group in optimizer.param_groups for p in group["params"]]


def _aliases(model: nn.Module) -> dict[str, str]:
    """Every name of a tied parameter -> its first name (`named_parameters` order)."""
    first: dict[nn.Parameter, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first.setdefault(param, name)
    return {name: first[param] for name, param in model.named_parameters(remove_duplicate=False)}


def _rekey(optim_sd: dict[str, Any], key: Mapping[Any, Any]) -> dict[str, Any]:
    """An optimizer state dict with each parameter key (position or name) mapped by `key`."""
    return {"state": {key[k]: v for k, v in optim_sd["state"].items()},
            "param_groups": [group | {"params": [key[k] for k in group["params"]]}
                             for group in optim_sd["param_groups"]]}
