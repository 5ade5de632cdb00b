"""Attention over packed rows at each row's own cost: sum(length^2), not the N^2 of a dense
block-diagonal mask over the N packed tokens.

transformers restricts packed rows to themselves with sdpa or eager too (packing.py), but with a
dense (N, N) mask: at 8K packed tokens that is 100x the attention of the same rows padded to
~100 tokens each, and building the mask alone takes ~0.7 s on a CPU. This implementation,
registered with transformers under `NAME` (`model.packed_attention=auto`; a forced path under
`attention_name(path)`), builds no mask for a call without padding or cache (`packed_mask`) and
takes the rows' boundaries from the packed forward (`cu_seq_lens_q`: the name transformers'
flash-attention path uses; else from `position_ids` restarting, in a sequence of batch 1) and
their lengths as host ints (`ROWS`, from `packing.Packed`, so no layer reads the device), then
runs one of (`choose`; the count of each in `PATHS`):
- "varlen": `torch.nn.attention.varlen.varlen_attn` (FlashAttention over variable-length rows,
  torch 2.10+), called as the installed torch takes it (`attention_kernels.varlen_call`), on CUDA
  in bf16/fp16 without dropout;
- "jagged": SDPA over nested jagged tensors (torch 2.4+, CUDA): torch's flash or
  memory-efficient kernels for torches without varlen, float32, or when forced (to time it);
- "grouped": sdpa, causal, on groups of rows of similar length (`row_groups`), each group
  gathered into one right-padded batch: a call per row costs 0.1-0.2 ms of overhead on a CPU, which
  for short rows (GRPO on short answers: hundreds of rows of ~30 tokens) costs more than the
  attention itself, while one padded call over rows of very different lengths computes up to
  rows x longest^2 for sum(length^2) of work. A causal row attends only to its own earlier
  tokens, so its padding tail changes nothing and is dropped. A call's fixed cost is measured
  on the CPU (`CALL_COST`) and derived from dispatch time on CUDA (`call_cost`);
- "masked": transformers' sdpa with its mask, for a sliding window narrower than the longest row
  that the chosen kernel cannot take (a window at least a row's length changes nothing).
Every other call (padded batches, generation with a cache) goes to transformers' sdpa with
sdpa's masks. `use_packed_attention(model, path)` switches a model whose attention is sdpa or
eager to it; flash-attention models already run packed rows as varlen and keep theirs.
Checkpoints do not record the switch (transformers does not save the implementation).

Not here: which rows are packed together (`packing.pack`), torch versions' kernel signatures
(`attention_kernels`), or any check that the result is right (`packing.check_packing` compares
packed rows with rows run alone).
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.config.names import PackedAttention, choices
from asyncrl.training import attention_kernels as kernels

NAME = "asyncrl_packed"
ROWS = "packed_row_lengths"
"""Forward kwarg: the packed rows' lengths as a tuple of host ints (`packing.Packed.forward_kwargs`)."""
PATHS: Counter[str] = Counter()
"""Packed attention calls (one per layer per forward) by the path that ran: tests and benches read it."""
_SWITCHED = ("sdpa", "eager")
_HALF = (torch.bfloat16, torch.float16)
CALL_COST = 8192
"""One attention call's fixed cost in token pairs (a row of length L costs L^2). On the 2-core CPU
an sdpa call's forward and backward overhead (0.14 ms) is the work of ~4K token pairs of single
rows, and a batched call also spreads better over the threads: groups at 8K were within a few
percent of the fastest on short, uniform and long-tail rows (`bench/attention_groups.py`)."""
CUDA_CALL_S = 2.5e-4
"""A group's host time on CUDA, where the kernels finish before the host has dispatched the next
ones: ~14 torch calls forward (the first GPU run: ~200 per layer for 13-16 groups) and as many
backward, at ~10 us of eager dispatch each. An estimate: `bench/attention_groups.py`'s fit
(call_s) measures it on the device."""
CUDA_ATTENTION_FLOPS = {torch.bfloat16: 3e14, torch.float16: 3e14, torch.float32: 5e13}
"""What padded causal sdpa sustains on an H100, forward and backward: FlashAttention-2 ~300
TFLOP/s in bf16 (Shah et al. 2024, FlashAttention-3, Fig. 5-6), float32 ~3/4 of the 67 TFLOP/s
float32 peak."""


def attention_name(path: PackedAttention) -> str:
    """The attention implementation name a model switched to `path` carries."""
    return NAME if path == "auto" else f"{NAME}_{path}"


_PATH_OF: dict[str, PackedAttention] = {attention_name(p): p for p in cast(tuple[PackedAttention, ...],
                                                                          choices(PackedAttention))}


def use_packed_attention(model: nn.Module, path: PackedAttention | None = None) -> None:
    """Run `model`'s attention through `packed_attention` when it is sdpa, eager or already
    packed (in place). `path`: `model.packed_attention`; None keeps a path chosen before, else
    auto. Raises a ConfigError when a forced path has no kernel in this torch."""
    _register()
    base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model  # peft
    current = getattr(getattr(base, "config", None), "_attn_implementation", None)
    if current not in _SWITCHED and current not in _PATH_OF:
        return
    chosen = path or _PATH_OF.get(cast(str, current), "auto")
    kernels.require(chosen)
    base.set_attn_implementation(attention_name(chosen))


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, path in _PATH_OF.items():
        AttentionInterface.register(name, packed_attention if path == "auto" else
                                    functools.partial(packed_attention, path=path))
        AttentionMaskInterface.register(name, packed_mask)


def packed_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' mask interface: sdpa's mask, but none for a call without a padding mask, a
    cache, a sliding window or extra mask functions (packed rows, or one row), whose rows
    `packed_attention` finds itself."""
    from transformers.masking_utils import sdpa_mask

    plain = (not args and kwargs.get("attention_mask") is None and kwargs.get("q_length") == kwargs.get("kv_length")
             and not kwargs.get("kv_offset") and kwargs.get("local_size") is None and not kwargs.get("use_vmap"))
    return None if plain else sdpa_mask(*args, **kwargs)


# Eager inside a compiled layer (`asyncrl.training.compile`): a graph break, since the kernel choice,
# the row plans and the path counts are host Python that would recompile on every new row count.
@torch.compiler.disable
def packed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, *, path: PackedAttention = "auto",
                     **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention interface: (B, H, N, D) query, (B, H_kv, N, D) key and value ->
    (B, N, H, D). Packed rows (batch 1, no mask) attend causally within themselves."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None and attention_mask is None and query.shape[0] == 1 and query.shape[2] == key.shape[2]:
        bounds = _bounds(kwargs.get("position_ids"), query.shape[2])
    if bounds is None:
        return _masked(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    assert query.shape[0] == 1, "packed rows are one sequence"
    lengths = tuple(kwargs.get(ROWS) or _lengths(bounds))  # from a compiled layer: `compile.HostLengths`
    window = kwargs.get("sliding_window")
    ran = choose(path, query.is_cuda, _dtype(query), dropout, window is not None and max(lengths) > window)
    PATHS[ran] += 1
    if ran == "masked":
        assert attention_mask is not None, "a sliding window over packed rows needs transformers' mask"
        return _masked(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    if ran == "grouped":
        return _per_row(query, key, value, [0, *itertools.accumulate(lengths)], dropout, scaling), None
    q, k, v = (x[0].transpose(0, 1).to(_dtype(query)).contiguous() for x in (query, key, value))  # (N, H, D)
    bounds = bounds.to(query.device, torch.int32)
    if ran == "varlen":
        out = cast(kernels.VarlenCall, kernels.varlen_kernel())(q, k, v, bounds, max(lengths), scaling, window)
    else:
        out = kernels.jagged_attention(q, k, v, bounds, lengths, scaling, dropout)
    return out[None], None  # (1, N, H, D)


def choose(path: PackedAttention, cuda: bool, dtype: torch.dtype, dropout: float, window_matters: bool) -> str:
    """The path of a packed call (`model.packed_attention`): auto takes varlen where this torch has
    it and the call suits it (CUDA, bf16 or fp16, no dropout, a sliding window that matters only
    where taken), else jagged on CUDA, else grouped; a forced path runs where it can, else grouped.
    A sliding window narrower than the rows, which grouped and jagged cannot take: "masked"."""
    varlen = kernels.varlen_kernel()
    if (path in ("auto", "varlen") and varlen is not None and cuda and dtype in _HALF and not dropout
            and (varlen.window or not window_matters)):
        return "varlen"
    if path in ("auto", "jagged") and cuda and kernels.jagged_kernel() and not window_matters:
        return "jagged"
    if path == "auto" and cuda and varlen is None and not kernels.jagged_kernel():
        kernels.note_grouped_on_cuda(torch.__version__)
    return "masked" if window_matters else "grouped"


def _masked(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
            dropout: float, scaling: float | None, kwargs: dict[str, Any]) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs = {k: v for k, v in kwargs.items() if k != ROWS}
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return out[0], None


def _bounds(position_ids: Tensor | None, length: int) -> Tensor | None:
    """Row boundaries of one packed sequence, from where its positions do not rise by 1 (as
    transformers' `find_packed_sequence_indices`); None for one row."""
    if position_ids is None:
        return None
    starts = torch.nonzero(torch.diff(position_ids[0]) != 1).flatten() + 1  # of every row but the first
    if len(starts) == 0:
        return None
    return torch.cat([starts.new_tensor([0]), starts, starts.new_tensor([length])])


def _lengths(bounds: Tensor) -> tuple[int, ...]:
    """The rows' lengths read back from `bounds`: for callers that do not pass `ROWS`."""
    return tuple(b - a for a, b in itertools.pairwise(bounds.tolist()))


def _dtype(query: Tensor) -> torch.dtype:
    """What the kernel runs in: the autocast dtype if on (rotary embeddings leave q, k float32)."""
    device = query.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype


def call_cost(device: str, dtype: torch.dtype, width: int) -> float:
    """One grouped call's fixed cost in token pairs, for attention `width` (= heads x head_dim)
    wide: `CALL_COST` on a CPU (measured); on CUDA the token pairs the GPU computes while the host
    dispatches a group (`CUDA_CALL_S`), a pair of a padded causal call costing 7 x width FLOPs
    (half the pairs computed, 4 x width forward for QK^T and PV, backward 2.5x forward).
    Example: bf16, Qwen2-0.5B's 14 heads x 64: 2.5e-4 x 3e14 / (7 x 896) = 12M token pairs."""
    if device != "cuda":
        return CALL_COST
    return CUDA_CALL_S * CUDA_ATTENTION_FLOPS.get(dtype, CUDA_ATTENTION_FLOPS[torch.float32]) / (7 * width)


def _per_row(query: Tensor, key: Tensor, value: Tensor, bounds: list[int], dropout: float,
             scaling: float | None) -> Tensor:
    """Causal attention of each packed row within itself, a group of rows (`row_groups`) per sdpa
    call: the tokens reordered group by group (one gather), each group's rows gathered from its
    slice into a right-padded batch, and the real outputs put back in packed order. Every gather
    is an index_select, whose backward adds into a tensor the size of its source: a group's own
    slice, not all N tokens. # (1, N, H, D)"""
    if query.shape[1] > key.shape[1]:  # grouped-query attention: each KV head serves several query heads
        key, value = (kernels.repeat_heads(x, query.shape[1]) for x in (key, value))
    cost = call_cost(query.device.type, _dtype(query), query.shape[1] * query.shape[3])
    plan = _plan(tuple(b - a for a, b in itertools.pairwise(bounds)), str(query.device), cost)
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
def _plan(lengths: tuple[int, ...], device: str, cost: float) -> _Plan:
    starts = [0, *itertools.accumulate(lengths)]
    order, sizes, groups = [], [], []
    for rows in row_groups(lengths, cost):
        order += [torch.arange(starts[r], starts[r + 1]) for r in rows]
        size = torch.tensor([lengths[r] for r in rows])[:, None]
        first = torch.cat([size.new_zeros(1, 1), size[:-1].cumsum(0)])  # each row's first token in the group
        column = torch.arange(int(size.max()))[None]
        index = first + torch.minimum(column, size - 1)  # the padding tail repeats the row's last token
        real = (column < size).flatten().nonzero().flatten()
        sizes.append(int(size.sum()))
        groups.append((len(rows), _to(index.flatten(), device), _to(real, device)))
    flat = torch.cat(order)
    return _Plan(_to(flat, device), sizes, groups, _to(torch.argsort(flat), device))


def _to(x: Tensor, device: str) -> Tensor:
    """A plan's index on `device`, copied without waiting for the device (host memory is staged)."""
    return x.to(device, non_blocking=True)


def row_groups(lengths: tuple[int, ...], cost: float | None = None) -> tuple[tuple[int, ...], ...]:
    """The rows (indices into `lengths`) that share an attention call: of the partitions of the
    rows sorted by length into runs, the one of least cost, a run costing `cost` (a call's, in
    token pairs; default `CALL_COST`, the CPU's) plus rows x its longest row^2 (what its padded
    batch computes).
    Example: (3, 3, 3, 300) -> ((3,), (0, 1, 2)): the long row alone, the short ones together."""
    call = CALL_COST if cost is None else cost
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    square = torch.tensor([float(lengths[i]) ** 2 for i in order], dtype=torch.float64)
    best, start = [0.0], [0]  # best[j]: the least cost of the first j sorted rows; start[j]: its last run's first
    for j in range(1, len(order) + 1):
        # a last run of rows i..j-1 has row i as its longest
        total = torch.tensor(best) + call + torch.arange(j, 0, -1, dtype=torch.float64) * square[:j]
        i = int(total.argmin())
        best.append(float(total[i]))
        start.append(i)
    runs, j = [], len(order)
    while j:
        runs.append(tuple(order[start[j]:j]))
        j = start[j]
    return tuple(runs[::-1])
