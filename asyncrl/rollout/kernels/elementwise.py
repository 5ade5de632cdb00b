"""The fused decode step's elementwise Triton kernels: residual add + RMSNorm, Qwen3's per-head q/k
RMSNorm + rotary + the K/V cache write, and SiLU-multiply. Each replaces a run of small eager ops
(the bf16 RMSNorm alone is ~8 kernels eager) with one launch, which is what a launch-bound decode
graph needs.

Every kernel rounds as the HF modules it replaces: it computes in float32 and casts to the
activation dtype wherever the HF code holds a tensor in that dtype (LlamaRMSNorm: float32
variance, cast back to the input dtype, then times the weight; the residual add, the rotary
products and their sum, SiLU then the multiply: each rounded once). In float32 the casts are
exact, so the kernels equal the eager ops up to the order of the norm's sum.

Not here: matmuls (the merged projections stay cuBLAS/MKL calls), attention
(`asyncrl.rollout.kernels.decode_attention`), or choosing when to use them
(`asyncrl.rollout.forward`). Importing this module runs `@triton.jit`, which reads
TRITON_INTERPRET then: tests set it before importing this module fresh.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rounded(x, dtype):
    """float32 `x` rounded to `dtype` (to nearest, ties to even), kept in float32: the value HF
    holds after a cast to the activation dtype. bfloat16 by its bits, because the interpreter's
    float32 -> bfloat16 cast truncates where the GPU's rounds."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif dtype == tl.float32:
        return x
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_stride, res_stride, out_stride,
                         res_out_stride, n, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:  # HF: residual + hidden_states, in the activation dtype
        r = tl.load(res_ptr + row * res_stride + cols, mask=inside, other=0.0).to(tl.float32)
        x = _rounded(x + r, dtype)
        tl.store(res_out_ptr + row * res_out_stride + cols, x.to(dtype), mask=inside)  # exact: x is rounded
    variance = tl.sum(x * x, axis=0) / n
    y = _rounded(x * tl.math.rsqrt(variance + eps), dtype)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, _rounded(w * y, dtype).to(dtype), mask=inside)


def add_rms_norm(delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + delta) * weight, residual + delta) in one launch; rows of (B, N).

    Without `delta` the residual is normed as it is and returned unchanged (a decode step's first
    layer). Rounds as HF's LlamaRMSNorm after HF's residual add."""
    assert residual.dtype == weight.dtype and residual.stride(-1) == 1, (residual.dtype, weight.dtype)
    rows, n = residual.shape
    out = torch.empty_like(residual)
    summed = residual if delta is None else torch.empty_like(residual)
    source = residual if delta is None else delta
    _add_rms_norm_kernel[(rows,)](
        source, residual, weight, out, summed, source.stride(0), residual.stride(0), out.stride(0),
        summed.stride(0), n, eps, HAS_RESIDUAL=delta is not None, BLOCK=triton.next_power_of_2(n),
    )
    return out, summed


@triton.jit
def _head_rms_norm(x1, x2, w_ptr, half, cols, inside, eps, dtype, D: tl.constexpr):
    """Qwen3's q_norm / k_norm over one head given as its two halves; HF's rounding."""
    variance = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D
    scale = tl.math.rsqrt(variance + eps)
    w1 = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + half + cols, mask=inside, other=0.0).to(tl.float32)
    y1 = _rounded(x1 * scale, dtype)
    y2 = _rounded(x2 * scale, dtype)
    return _rounded(w1 * y1, dtype), _rounded(w2 * y2, dtype)


@triton.jit
def _rotary(x1, x2, c1, c2, s1, s2, dtype):
    """HF's x * cos + rotate_half(x) * sin, each product and the sum in the activation dtype."""
    out1 = _rounded(_rounded(x1 * c1, dtype) + _rounded(-x2 * s1, dtype), dtype).to(dtype)
    out2 = _rounded(_rounded(x2 * c2, dtype) + _rounded(x1 * s2, dtype), dtype).to(dtype)
    return out1, out2


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_ptr, k_cache, v_cache, pos_ptr,
                       qkv_stride, cs_stride, pos_stride, k_slot, k_head, k_pos, v_slot, v_head, v_pos, eps,
                       H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr,
                       BLOCK: tl.constexpr):
    # int64: `row * k_slot` passes 2^31 elements once a layer's cache view does (128 slots of a
    # 32K-position Qwen2-7B cache), and int32 would wrap into another slot's memory
    row = tl.program_id(0).to(tl.int64)  # row b lives in cache slot b
    head = tl.program_id(1).to(tl.int64)  # 0..H-1: a query head; H..H+HKV-1: a key head (and its value head)
    half = D // 2
    cols = tl.arange(0, BLOCK)
    inside = cols < half
    dtype = q_ptr.dtype.element_ty
    src = qkv_ptr + row * qkv_stride + head * D
    x1 = tl.load(src + cols, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + cols, mask=inside, other=0.0).to(tl.float32)
    if QK_NORM:
        if head < H:
            x1, x2 = _head_rms_norm(x1, x2, qw_ptr, half, cols, inside, eps, dtype, D)
        else:
            x1, x2 = _head_rms_norm(x1, x2, kw_ptr, half, cols, inside, eps, dtype, D)
    c1 = tl.load(cos_ptr + row * cs_stride + cols, mask=inside, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + row * cs_stride + half + cols, mask=inside, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + row * cs_stride + cols, mask=inside, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + row * cs_stride + half + cols, mask=inside, other=0.0).to(tl.float32)
    out1, out2 = _rotary(x1, x2, c1, c2, s1, s2, dtype)
    if head < H:
        dst = q_ptr + (row * H + head) * D
        tl.store(dst + cols, out1, mask=inside)
        tl.store(dst + half + cols, out2, mask=inside)
    else:
        kv = head - H
        pos = tl.load(pos_ptr + row * pos_stride)
        k_dst = k_cache + row * k_slot + kv * k_head + pos * k_pos
        tl.store(k_dst + cols, out1, mask=inside)
        tl.store(k_dst + half + cols, out2, mask=inside)
        v_src = qkv_ptr + row * qkv_stride + (H + HKV + kv) * D
        v_dst = v_cache + row * v_slot + kv * v_head + pos * v_pos
        tl.store(v_dst + cols, tl.load(v_src + cols, mask=inside), mask=inside)
        tl.store(v_dst + half + cols, tl.load(v_src + half + cols, mask=inside), mask=inside)


def rope_cache_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor, positions: torch.Tensor, *, heads: int, kv_heads: int,
                     head_norms: tuple[torch.Tensor, torch.Tensor, float] | None) -> torch.Tensor:
    """One launch per layer: the merged projection's q and k heads get Qwen3's per-head RMSNorm
    (`head_norms` = (q weight, k weight, eps), or None) and rotary; k and v go into the cache at
    (row, head, positions[row]); q comes back as (B, heads, D).

    qkv: (B, (heads + 2 kv_heads) D); cos/sin: (B, D) in qkv's dtype; keys/values: one layer's
    (slots, kv_heads, capacity, D) buffers, row b written to slot b; positions: (B,) int64."""
    rows = qkv.shape[0]
    d = keys.shape[-1]
    assert qkv.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride() == cos.stride() and d % 2 == 0
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and qkv.shape[1] == (heads + 2 * kv_heads) * d
    q = torch.empty(rows, heads, d, dtype=qkv.dtype, device=qkv.device)
    q_weight, k_weight, eps = head_norms if head_norms is not None else (cos, cos, 0.0)
    _rope_cache_kernel[(rows, heads + kv_heads)](
        qkv, cos, sin, q_weight, k_weight, q, keys, values, positions, qkv.stride(0), cos.stride(0),
        positions.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1),
        values.stride(2), eps, H=heads, HKV=kv_heads, D=d, QK_NORM=head_norms is not None,
        BLOCK=triton.next_power_of_2(d // 2),
    )
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gu_ptr + row * gu_stride + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * gu_stride + n + cols, mask=inside, other=0.0).to(tl.float32)
    act = _rounded(gate / (1.0 + tl.exp(-gate)), dtype)  # HF: act_fn(gate) * up
    tl.store(out_ptr + row * out_stride + cols, _rounded(act * up, dtype).to(dtype), mask=inside)


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """SiLU(gate) * up from the merged gate/up projection (B, 2I) -> (B, I), one launch."""
    assert gate_up.stride(-1) == 1 and gate_up.shape[1] % 2 == 0
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(block, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block)
    return out
