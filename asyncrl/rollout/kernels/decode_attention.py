"""Decode attention over each row's real length: a split-KV (flash-decoding) Triton kernel.

One query token per row attends over the first `lengths[row]` cached positions of its slot
(row i lives in slot i), read from the head-major cache `(slots, kv_heads, capacity, head_dim)`
of `asyncrl.rollout.kv_cache` (one layer's view). The lengths are a device tensor, so the launch
has fixed shapes whatever the rows' lengths: one CUDA graph per batch bucket serves every step,
and no row reads past its own length (the matmul path reads every row to a power of two of the
longest row, and a padding row as far as a real one).

- Grouped KV heads: a program serves one (row, KV head) and all `groups` query heads sharing
  that head, as the rows of one `tl.dot` (padded to 16, the smallest dot), so each key and value
  is read once per row, not once per query head, and nothing is repeated.
- Split KV (Dao et al. 2023, "Flash-Decoding for long-context inference"): a row's positions are
  cut into `splits` chunks (each a multiple of `BLOCK_N`, so a short row takes fewer, and the
  later programs exit at once), the chunks run as separate programs, each keeping an online
  softmax (running max and sum, float32), and a second kernel combines the chunks' outputs
  weighted by exp(chunk log-sum-exp - max). With one split the first kernel writes the output
  itself: one launch.
- A row of length 0 (a padding row of a batch bucket) reads nothing and its output is zeros.
- Softmax statistics and accumulation in float32; the probabilities are rounded to the value
  dtype before the product with V, as HF's eager attention does; float32 products are exact
  IEEE ones (no TF32).

On the CPU Triton runs only interpreted (`TRITON_INTERPRET=1`, set before this module is
imported: `triton.jit` reads it when it decorates), which is how the tests check it; the engine
keeps the matmul path there unless asked (`rollout.decode_attention`). Not here: which path a
forward takes (`asyncrl.rollout.forward`), the K/V write of the new token, causal prefill.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from asyncrl.rollout.sizes import pow2_at_least

BLOCK_N = 64
"""Positions per loop iteration (and the granularity of a split's chunk)."""
MAX_SPLITS = 16
PROGRAMS_PER_SM = 4
"""Programs per streaming multiprocessor that `split_count` aims the launch at: enough resident
programs to hide memory latency without splitting rows into chunks too small to amortise the combine."""
INTERPRETED_PROGRAMS = 64
"""The target without a GPU (the interpreter runs programs one by one: any value is correct;
this one makes the CPU tests run splits)."""


@functools.cache
def target_programs(device: torch.device) -> int:
    """Programs a launch should have to fill `device`: `PROGRAMS_PER_SM` per SM on CUDA."""
    if device.type != "cuda":
        return INTERPRETED_PROGRAMS
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def split_count(rows: int, kv_heads: int, capacity: int, programs: int, block_n: int = BLOCK_N) -> int:
    """Chunks per row: the smallest power of two with rows x kv_heads x splits >= `programs`, at
    most `MAX_SPLITS` and at most one chunk per `block_n` positions of the cache's capacity.

    Example (Qwen2-0.5B: 2 KV heads, capacity 2304; an H200's 132 SMs -> 528 programs):
    1 row -> 16, 64 rows -> 8 (1,024 programs), 256 rows -> 2 (1,024)."""
    most = max(1, min(MAX_SPLITS, capacity // block_n))
    splits = 1
    while splits < most and rows * kv_heads * splits < programs:
        splits *= 2
    return splits


@triton.jit
def _split_kv_kernel(
    q_ptr, k_ptr, v_ptr, lengths_ptr, out_ptr, lse_ptr, length_row,
    q_row, q_head, k_slot, k_head, k_pos, v_slot, v_head, v_pos,
    o_row, o_head, o_split, l_row, l_head, scale,
    GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
):
    """Program (row, kv head, split): the attention of the head's query group over one chunk."""
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + row * length_row).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUPS + g
    qd_ok = (g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + row * q_row + heads[:, None] * q_head + d[None, :], mask=qd_ok, other=0.0)
    k_base = k_ptr + row * k_slot + kv_head * k_head
    v_base = v_ptr + row * v_slot + kv_head * v_head
    top = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for block in range(start, end, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        nd_ok = (n < end)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(k_base + n[:, None] * k_pos + d[None, :], mask=nd_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (G, N) float32
        scores = tl.where((n < end)[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        rescale = tl.exp(top - new_top)
        p = tl.exp(scores - new_top[:, None])
        total = total * rescale + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * v_pos + d[None, :], mask=nd_ok, other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        top = new_top
    out = acc / tl.where(total > 0, total, 1.0)[:, None]  # an empty chunk or row: zeros
    o_ptr = out_ptr + row * o_row + heads[:, None] * o_head + d[None, :]
    if SPLITS == 1:
        tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=qd_ok)
    else:
        tl.store(o_ptr + split * o_split, out, mask=qd_ok)
        lse = top + tl.log(tl.where(total > 0, total, 1.0))  # -inf for an empty chunk
        tl.store(lse_ptr + row * l_row + heads * l_head + split, lse, mask=g < GROUPS)


@triton.jit
def _combine_kernel(
    part_ptr, lse_ptr, out_ptr, p_row, p_head, p_split, l_row, l_head, o_row, o_head,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Program (row, query head): the chunks' outputs weighted by their share of the softmax mass."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + row * l_row + head * l_head + s, mask=s < SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp(lse - tl.where(top > float("-inf"), top, 0.0))  # empty chunks weigh 0
    sd_ok = (s < SPLITS)[:, None] & (d < HEAD_DIM)[None, :]
    part = tl.load(part_ptr + row * p_row + head * p_head + s[:, None] * p_split + d[None, :], mask=sd_ok,
                   other=0.0)
    mass = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * part, 0) / tl.where(mass > 0, mass, 1.0)  # a row of length 0: zeros
    tl.store(out_ptr + row * o_row + head * o_head + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                     scale: float, splits: int, block_n: int = BLOCK_N) -> torch.Tensor:
    """Attention of each row's query over its slot's first `lengths[row]` cached positions.

    q: (B, H, D), the last dim contiguous; keys/values: (slots >= B, Hkv, capacity, D), one
    layer of the cache, H a multiple of Hkv (query head h reads KV head h // (H / Hkv), as HF's
    `repeat_kv`); lengths: (B,) int on q's device (any stride), each in [0, capacity]. Returns
    (B, H, D) in q's dtype; a row of length 0 is zeros. No host read: capturable in a CUDA graph.
    """
    rows, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    assert heads == groups * kv_heads and keys.shape == values.shape and keys.shape[0] >= rows, \
        (q.shape, keys.shape, values.shape)
    assert q.stride(-1) == keys.stride(-1) == values.stride(-1) == 1, "head_dim must be contiguous"
    out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device)
    block_d = pow2_at_least(head_dim, 16)
    if splits == 1:
        part, lse = out, out  # one chunk: the kernel writes the output, no partials
    else:
        part = torch.empty((rows, heads, splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((rows, heads, splits), dtype=torch.float32, device=q.device)
    _split_kv_kernel[(rows, kv_heads, splits)](
        q, keys, values, lengths, part, lse, lengths.stride(0),
        q.stride(0), q.stride(1), *keys.stride()[:3], *values.stride()[:3],
        part.stride(0), part.stride(1), part.stride(2) if splits > 1 else 0,
        lse.stride(0), lse.stride(1), scale,
        GROUPS=groups, BLOCK_G=pow2_at_least(groups, 16), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=block_n, SPLITS=splits,
    )
    if splits > 1:
        _combine_kernel[(rows, heads)](
            part, lse, out, part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS=splits, BLOCK_S=pow2_at_least(splits, 2),
        )
    return out
