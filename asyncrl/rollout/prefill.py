"""Packed prefill: a step's admitted prompts concatenated into one row of tokens, no padding.

`pack_prompts` lays the prompts out on the host as one int64 tensor (token ids, positions, cache
slots, row bounds, each row's last token), so they reach the device in one copy;
`PackedPrompts.view` reads it back there as the tensors `BatchedForward.prefill_packed` takes. A
layout may be padded to a token bucket and a row bucket (the captured prefill of
`asyncrl.rollout.graphs.BucketedPrefill`): the dummy tail tokens extend the last prompt, as right
padding of its own row, so they are attended by nothing real, and their K/V land past that prompt's
end in its own slot (positions a decode step overwrites before it reads them, as the padded
prefill's padding does); rows past the real ones have no tokens.

`prefill_path` picks how a step prefills. On CUDA in bf16/fp16: "varlen"
(`torch.nn.attention.varlen`, torch 2.10+: one FlashAttention call per layer over all rows), else
"jagged" (SDPA over nested jagged tensors, torch 2.4+), else "padded" (`BatchedForward.prefill`:
rows right-padded, one causal SDPA call per layer); float32 on CUDA is padded too (FlashAttention
has no float32). On the CPU, where torch has a kernel for neither packed call: "rows", packed
with one exact causal SDPA call per prompt, which measured faster than the padded call (no
padding goes through the projections and the MLP; docs/engine.md). Torch versions' kernel
signatures are `asyncrl.training.attention_kernels`' business.

Not here: the layer loop (`BatchedForward.prefill_packed`), graphs (`asyncrl.rollout.graphs`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from asyncrl import torch_at_least
from asyncrl.training import attention_kernels as kernels

PrefillPath = Literal["padded", "varlen", "jagged", "rows"]
_HALF = (torch.bfloat16, torch.float16)
_SDPA_GQA = torch_at_least(2, 5)  # scaled_dot_product_attention(enable_gqa=...)


def prefill_path(device: torch.device, dtype: torch.dtype) -> PrefillPath:
    """How a step on `device` with weights in `dtype` prefills (see the module doc)."""
    if device.type != "cuda":
        return "rows"
    if dtype not in _HALF:
        return "padded"
    if kernels.varlen_kernel() is not None:
        return "varlen"
    return "jagged" if kernels.jagged_kernel() else "padded"


@dataclass(frozen=True)
class PackedPrompts:
    """One packed prefill's inputs on the device; N tokens (real and tail) in R rows."""

    ids: Tensor  # (N,) int64 token ids
    positions: Tensor  # (N,) int64: each token's position in its row, and in its cache slot
    slots: Tensor  # (N,) int64: each token's cache slot
    bounds: Tensor  # (R + 1,) int32: where each row starts, then N (cu_seqlens)
    last: Tensor  # (R,) int64: each row's last real token (rows past the real ones: token 0)
    lengths: tuple[int, ...]  # (R,) host ints: each row's tokens, the tail included in the last
    longest: int  # host int >= every row's length: the kernel's max_seqlen

    @staticmethod
    def view(flat: Tensor, tokens: int, rows: int, lengths: tuple[int, ...], longest: int) -> PackedPrompts:
        """The tensors of a `pack_prompts` layout of `tokens` and `rows`, as views of `flat`
        (bounds cast to int32: one small kernel)."""
        ids, positions, slots = flat[: 3 * tokens].view(3, tokens)
        bounds = flat[3 * tokens : 3 * tokens + rows + 1].to(torch.int32)
        last = flat[3 * tokens + rows + 1 : 3 * tokens + 2 * rows + 1]
        return PackedPrompts(ids, positions, slots, bounds, last, lengths, longest)


def layout_size(tokens: int, rows: int) -> int:
    """Elements of a `pack_prompts` layout."""
    return 3 * tokens + 2 * rows + 1


def pack_prompts(contexts: Sequence[Sequence[int]], first_slot: int, *, tokens: int | None = None,
                 rows: int | None = None, capacity: int | None = None,
                 starts: Sequence[int] | None = None) -> tuple[Tensor, tuple[int, ...]]:
    """(host int64 layout, row lengths) of `contexts` prefilled into slots first_slot.. .

    Padded to `tokens` and `rows` when given (default: the prompts' own): the tail tokens (id 0)
    continue the last prompt at positions past its end, at most `capacity` - 1 (positions past
    the cache repeat its last one; they are never read). Layout: ids, positions, slots (`tokens`
    each), bounds (`rows` + 1), last token of each row (`rows`).
    Example: contexts (5, 6, 7), (8,), first_slot 2, tokens 6, rows 3 -> ids 5 6 7 8 0 0,
    positions 0 1 2 0 1 2, slots 2 2 2 3 3 3, bounds 0 3 6 6, last 2 3 0; lengths (3, 3, 0).
    `starts`: each row's first position (a prefix-cache hit's tokens follow its cached ones);
    default 0. Example: contexts (5, 6), (8,), starts 4, 0 -> positions 4 5 0.
    """
    lengths = [len(c) for c in contexts]
    real = sum(lengths)
    tokens, rows = tokens or real, rows or len(contexts)
    assert real <= tokens and len(contexts) <= rows, (real, tokens, len(contexts), rows)
    tail = tokens - real
    flat = torch.zeros(layout_size(tokens, rows), dtype=torch.int64)
    ids, positions, slots = flat[: 3 * tokens].view(3, tokens)
    ids[:real] = torch.tensor([t for c in contexts for t in c], dtype=torch.int64)
    starts = starts or [0] * len(lengths)
    end = starts[-1] + lengths[-1]
    spans = [torch.arange(s, s + n) for s, n in zip(starts, lengths)]
    positions[:] = torch.cat([*spans, torch.arange(end, end + tail)])
    if capacity is not None:
        positions.clamp_(max=capacity - 1)
    slots[:] = torch.repeat_interleave(torch.arange(first_slot, first_slot + len(lengths)),
                                       torch.tensor(lengths[:-1] + [lengths[-1] + tail]))
    row_lengths = (*lengths[:-1], lengths[-1] + tail) + (0,) * (rows - len(lengths))
    ends = list(itertools.accumulate(row_lengths))
    flat[3 * tokens : 3 * tokens + rows + 1] = torch.tensor([0, *ends])
    flat[3 * tokens + rows + 1 : 3 * tokens + rows + 1 + len(lengths)] = torch.tensor(
        list(itertools.accumulate(lengths))) - 1
    return flat, row_lengths


def packed_attention(q: Tensor, k: Tensor, v: Tensor, packed: PackedPrompts, path: PrefillPath,
                     scale: float) -> Tensor:
    """Causal attention of each packed row within itself: (N, H, D) query, (N, H_kv, D) key and
    value -> (N, H, D). One kernel call per layer for "varlen" and "jagged"; "rows" (the CPU's)
    one SDPA call per row."""
    if path == "varlen":
        call = cast(kernels.VarlenCall, kernels.varlen_kernel())
        return call(q, k, v, packed.bounds, packed.longest, scale)
    if path == "jagged":
        return kernels.jagged_attention(q, k, v, packed.bounds, packed.lengths, scale)
    assert path == "rows", path
    outs, start = [], 0
    for n in filter(None, packed.lengths):  # rows past the real ones have no tokens
        qr, kr, vr = (x[start : start + n].transpose(0, 1)[None] for x in (q, k, v))  # (1, H, n, D)
        outs.append(causal_attention(qr, kr, vr, scale)[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


def cached_attention(q: Tensor, keys: Tensor, values: Tensor, lengths: Sequence[int], starts: Sequence[int],
                     first_slot: int, scale: float) -> Tensor:
    """Attention of packed rows whose K/V are in their cache slots (row r: slot first_slot + r,
    its tokens at positions starts[r] .. starts[r] + lengths[r] - 1, written already): each
    query attends its slot's positions up to its own. q (N, H, D), keys/values one layer's
    (slots, H_kv, capacity, D) -> (N, H, D). One SDPA call per row, the causal mask offset by
    the start (SDPA's own is_causal aligns a short query with the first keys, not the last)."""
    outs, at = [], 0
    for row, (n, start) in enumerate(zip(lengths, starts)):
        span = start + n
        qr = q[at : at + n].transpose(0, 1)[None]  # (1, H, n, D)
        kr, vr = keys[first_slot + row, :, :span][None], values[first_slot + row, :, :span][None]  # (1, Hkv, span, D)
        allowed = torch.ones(n, span, dtype=torch.bool, device=q.device).tril(diagonal=start)
        if _SDPA_GQA:
            out = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=allowed, scale=scale, enable_gqa=True)
        else:  # torch < 2.5
            out = F.scaled_dot_product_attention(qr, kernels.repeat_heads(kr, q.shape[1]),
                                                 kernels.repeat_heads(vr, q.shape[1]), attn_mask=allowed, scale=scale)
        outs.append(out[0].transpose(0, 1))
        at += n
    return torch.cat(outs)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Causal SDPA with grouped KV heads: q (n, H, T, D), k/v (n, Hkv, T, D)."""
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(q, kernels.repeat_heads(k, q.shape[1]),  # torch < 2.5
                                          kernels.repeat_heads(v, q.shape[1]), is_causal=True, scale=scale)
