"""Attention over packed rows at each row's own cost: sum(length^2), not the N^2 of a dense
block-diagonal mask over the N packed tokens.

transformers restricts packed rows to themselves with sdpa or eager too (packing.py), but with a
dense (N, N) mask: at 8K packed tokens that is 100x the attention of the same rows padded to
~100 tokens each, and building the mask alone takes ~0.7 s on a CPU. This implementation,
registered with transformers under `NAME`, builds no mask for a call without padding or cache
(`packed_mask`) and takes the rows' boundaries from the packed forward (`cu_seq_lens_q`,
`max_length_q`: the names transformers' flash-attention path uses; else from `position_ids`
restarting, in a sequence of batch 1), then runs
- on CUDA in bf16/fp16: `torch.nn.attention.varlen.varlen_attn` (FlashAttention over
  variable-length rows, torch 2.10+);
- otherwise: sdpa, causal, on groups of rows of similar length (`row_groups`), each group
  gathered into one right-padded batch: a call per row costs 0.1-0.2 ms of overhead on a CPU, which
  for short rows (GRPO on short answers: hundreds of rows of ~30 tokens) costs more than the
  attention itself, while one padded call over rows of very different lengths computes up to
  rows x longest^2 for sum(length^2) of work. A causal row attends only to its own earlier
  tokens, so its padding tail changes nothing and is dropped.
Every other call (padded batches, generation with a cache) goes to transformers' sdpa with
sdpa's masks. `use_packed_attention(model)` switches a model whose attention is sdpa or eager to
it; flash-attention models already run packed rows as varlen and keep theirs. Checkpoints do not
record the switch (transformers does not save the implementation).

Not here: which rows are packed together (`packing.pack`) or any check that the result is right
(`packing.check_packing` compares packed rows with rows run alone).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NAME = "asyncrl_packed"
_SWITCHED = ("sdpa", "eager")
CALL_COST = 8192
"""One attention call's fixed cost in token pairs (a row of length L costs L^2). On the 2-core CPU
an sdpa call's forward and backward overhead (0.14 ms) is the work of ~4K token pairs of single
rows, and a batched call also spreads better over the threads: groups at 8K were within a few
percent of the fastest on short, uniform and long-tail rows (`bench/attention_groups.py`)."""


def use_packed_attention(model: nn.Module) -> None:
    """Run `model`'s attention through `packed_attention` when it is sdpa or eager (in place)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_attention)
    AttentionMaskInterface.register(NAME, packed_mask)
    base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model  # peft
    config = getattr(base, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) in _SWITCHED:
        base.set_attn_implementation(NAME)


def packed_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' mask interface: sdpa's mask, but none for a call without a padding mask, a
    cache, a sliding window or extra mask functions (packed rows, or one row), whose rows
    `packed_attention` finds itself."""
    from transformers.masking_utils import sdpa_mask

    plain = (not args and kwargs.get("attention_mask") is None and kwargs.get("q_length") == kwargs.get("kv_length")
             and not kwargs.get("kv_offset") and kwargs.get("local_size") is None and not kwargs.get("use_vmap"))
    return None if plain else sdpa_mask(*args, **kwargs)


def packed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention interface: (B, H, N, D) query, (B, H_kv, N, D) key and value ->
    (B, N, H, D). Packed rows (batch 1, no mask) attend causally within themselves."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None and attention_mask is None and query.shape[0] == 1 and query.shape[2] == key.shape[2]:
        bounds = _bounds(kwargs.get("position_ids"), query.shape[2])
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    assert query.shape[0] == 1, "packed rows are one sequence"
    assert kwargs.get("sliding_window") is None, "packed attention has no sliding window"
    if _flash_ok(query, dropout):
        longest = kwargs.get("max_length_q") or int((bounds[1:] - bounds[:-1]).max())
        return _flash(query, key, value, bounds.to(query.device, torch.int32), longest, scaling), None
    return _per_row(query, key, value, bounds.tolist(), dropout, scaling), None


def _bounds(position_ids: Tensor | None, length: int) -> Tensor | None:
    """Row boundaries of one packed sequence, from where its positions do not rise by 1 (as
    transformers' `find_packed_sequence_indices`); None for one row."""
    if position_ids is None:
        return None
    starts = torch.nonzero(torch.diff(position_ids[0]) != 1).flatten() + 1  # of every row but the first
    if len(starts) == 0:
        return None
    return torch.cat([starts.new_tensor([0]), starts, starts.new_tensor([length])])


def _flash_ok(query: Tensor, dropout: float) -> bool:
    """Whether `varlen_attn` can run this call: CUDA, half precision, no dropout, and a torch whose
    `varlen_attn` takes the arguments `_flash` passes (torch 2.13's; older ones may not)."""
    if not query.is_cuda or dropout or _dtype(query) not in (torch.bfloat16, torch.float16):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    return {"scale", "window_size", "enable_gqa"} <= set(inspect.signature(varlen_attn).parameters)


def _dtype(query: Tensor) -> torch.dtype:
    """What the kernel runs in: the autocast dtype if on (rotary embeddings leave q, k float32)."""
    device = query.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype


def _flash(query: Tensor, key: Tensor, value: Tensor, bounds: Tensor, longest: int,
           scaling: float | None) -> Tensor:
    from torch.nn.attention.varlen import varlen_attn

    dtype = _dtype(query)
    q, k, v = (x[0].transpose(0, 1).to(dtype).contiguous() for x in (query, key, value))  # (N, H, D)
    out = varlen_attn(q, k, v, bounds, bounds, longest, longest, scale=scaling, window_size=(-1, 0),
                      enable_gqa=q.shape[1] != k.shape[1])  # (N, H, D): no aux asked for
    return cast(Tensor, out)[None]  # (1, N, H, D)


def _per_row(query: Tensor, key: Tensor, value: Tensor, bounds: list[int], dropout: float,
             scaling: float | None) -> Tensor:
    """Causal attention of each packed row within itself, a group of rows (`row_groups`) per sdpa
    call: the tokens reordered group by group (one gather), each group's rows gathered from its
    slice into a right-padded batch, and the real outputs put back in packed order. Every gather
    is an index_select, whose backward adds into a tensor the size of its source: a group's own
    slice, not all N tokens. # (1, N, H, D)"""
    heads = query.shape[1] // key.shape[1]
    if heads > 1:  # grouped-query attention: each KV head serves `heads` query heads
        key, value = (x.repeat_interleave(heads, dim=1) for x in (key, value))
    plan = _plan(tuple(b - a for a, b in zip(bounds, bounds[1:])), str(query.device))
    slices = [x[0].transpose(0, 1).index_select(0, plan.order).split(plan.sizes)  # (tokens, H, D) per group
              for x in (query, key, value)]
    outs = []
    for g, (rows, index, real) in enumerate(plan.groups):
        q, k, v = (x[g].index_select(0, index).unflatten(0, (rows, -1)).transpose(1, 2) for x in slices)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
        outs.append(out.transpose(1, 2).flatten(0, 1).index_select(0, real))  # (tokens, H, D)
    return torch.cat(outs).index_select(0, plan.back)[None]  # (1, N, H, D)


@dataclass(frozen=True)
class _Plan:
    order: Tensor  # (N,) the packed tokens, group by group
    sizes: list[int]  # tokens per group
    groups: list[tuple[int, Tensor, Tensor]]  # rows; the padded batch's indices into the group's tokens; its real ones
    back: Tensor  # (N,) from group order back to packed order


@functools.lru_cache(maxsize=8)  # the layers of a forward share their rows' lengths
def _plan(lengths: tuple[int, ...], device: str) -> _Plan:
    starts = [0, *itertools.accumulate(lengths)]
    order, sizes, groups = [], [], []
    for rows in row_groups(lengths):
        order += [torch.arange(starts[r], starts[r + 1]) for r in rows]
        size = torch.tensor([lengths[r] for r in rows])[:, None]
        first = torch.cat([size.new_zeros(1, 1), size[:-1].cumsum(0)])  # each row's first token in the group
        column = torch.arange(int(size.max()))[None]
        index = first + torch.minimum(column, size - 1)  # the padding tail repeats the row's last token
        real = (column < size).flatten().nonzero().flatten()
        sizes.append(int(size.sum()))
        groups.append((len(rows), index.flatten().to(device), real.to(device)))
    flat = torch.cat(order)
    return _Plan(flat.to(device), sizes, groups, torch.argsort(flat).to(device))


def row_groups(lengths: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The rows (indices into `lengths`) that share an attention call: of the partitions of the
    rows sorted by length into runs, the one of least cost, a run costing `CALL_COST` plus rows x
    its longest row^2 (what its padded batch computes).
    Example: (3, 3, 3, 300) -> ((3,), (0, 1, 2)): the long row alone, the short ones together."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    square = torch.tensor([float(lengths[i]) ** 2 for i in order], dtype=torch.float64)
    best, start = [0.0], [0]  # best[j]: the least cost of the first j sorted rows; start[j]: its last run's first
    for j in range(1, len(order) + 1):
        # a last run of rows i..j-1 has row i as its longest
        cost = torch.tensor(best) + CALL_COST + torch.arange(j, 0, -1, dtype=torch.float64) * square[:j]
        i = int(cost.argmin())
        best.append(float(cost[i]))
        start.append(i)
    runs, j = [], len(order)
    while j:
        runs.append(tuple(order[start[j]:j]))
        j = start[j]
    return tuple(runs[::-1])
