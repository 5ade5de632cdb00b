"""Merged projections for the fused decode step: q/k/v as one (q + 2 kv, hidden) matrix and
gate/up as one (2 intermediate, hidden) matrix, so each is one matmul per layer.

The HF modules' own parameters become row views of the merged buffers (`merge_layer`): the model
keeps every parameter name, shape and value, so a weight load (`asyncrl.models.weights.load_into`,
which copies into each named parameter) writes the trainer's separate projections straight into
the merged buffers, in place, and the engine's weight checksum reads what the trainer sent. No
weight is held twice, and a captured CUDA graph, which reads the merged buffers, never sees a
parameter rebound. Merging twice reuses the first merge's buffers (the views are already
adjacent), so two forwards over one model share them.

Not here: the kernels that read them (`asyncrl.rollout.kernels`), or when to merge
(`asyncrl.rollout.forward.BatchedForward`, only with fusion on). Moving the model afterwards
(`model.to(...)`) would rebind its parameters and break the views: the engine's model is placed
before it is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn


@dataclass(frozen=True)
class MergedLayer:
    qkv_weight: torch.Tensor
    """(heads D + 2 kv_heads D, hidden): q_proj, k_proj, v_proj rows, in that order."""
    qkv_bias: torch.Tensor | None
    """(heads D + 2 kv_heads D,) when the projections have biases (Qwen2), else None."""
    gate_up_weight: torch.Tensor
    """(2 intermediate, hidden): gate_proj rows, then up_proj rows."""


def _linears(module: nn.Module, *names: str) -> list[nn.Linear]:
    return [cast(nn.Linear, getattr(module, name)) for name in names]


def merge_layer(attn: nn.Module, mlp: nn.Module) -> MergedLayer:
    """Merge one decoder layer's q/k/v and gate/up projections (their parameters become views)."""
    qkv = _linears(attn, "q_proj", "k_proj", "v_proj")
    return MergedLayer(
        qkv_weight=merge_rows(qkv, "weight"),
        qkv_bias=merge_rows(qkv, "bias") if qkv[0].bias is not None else None,
        gate_up_weight=merge_rows(_linears(mlp, "gate_proj", "up_proj"), "weight"),
    )


def merge_rows(modules: Sequence[nn.Linear], name: str) -> torch.Tensor:
    """One buffer holding the `name` parameters of `modules` stacked along dim 0; each module's
    parameter is rebound to its rows of it, keeping its requires_grad."""
    parts: list[torch.Tensor] = [getattr(m, name) for m in modules]
    rows = sum(p.shape[0] for p in parts)
    if _adjacent(parts):  # merged before: the views already tile one buffer
        return parts[0].detach().as_strided((rows, *parts[0].shape[1:]), parts[0].stride())
    with torch.no_grad():
        merged = torch.cat([p.detach() for p in parts])
    start = 0
    for module, part in zip(modules, parts, strict=True):
        stop = start + part.shape[0]
        setattr(module, name, nn.Parameter(merged[start:stop], requires_grad=part.requires_grad))
        start = stop
    return merged


def _adjacent(parts: Sequence[torch.Tensor]) -> bool:
    """Whether `parts` are contiguous row blocks that follow each other in one storage."""
    storage = parts[0].untyped_storage().data_ptr()
    offset = parts[0].storage_offset()
    for part in parts:
        if not part.is_contiguous() or part.untyped_storage().data_ptr() != storage or part.storage_offset() != offset:
            return False
        offset += part.numel()
    return True


def aliases(layer: MergedLayer, attn: nn.Module, mlp: nn.Module) -> bool:
    """Whether the modules' parameters still are the merged buffers' rows (nothing rebound them)."""
    qkv, gate_up = _linears(attn, "q_proj", "k_proj", "v_proj"), _linears(mlp, "gate_proj", "up_proj")
    pairs = [(layer.qkv_weight, [m.weight for m in qkv]), (layer.gate_up_weight, [m.weight for m in gate_up])]
    if layer.qkv_bias is not None:
        pairs.append((layer.qkv_bias, [m.bias for m in qkv]))
    return all(_adjacent(parts) and parts[0].data_ptr() == merged.data_ptr() for merged, parts in pairs)
