"""Decode attention of the fast forward (`BatchedForward.decode`): which path runs, and the setup
a decode step does once for all its layers.

Paths (`rollout.decode_attention`; every decode step counted in `PATHS` under the path it took):
- "matmul": two batched matmuls over the first L cached positions of every row, with an
  additive mask per row (L: the host's `length`, in CUDA graphs a power of two >= the furthest
  row, `graphs.attention_length`). On the CPU ~3x faster than SDPA, whose kernels take a generic
  path for a masked, strided cache view. It reads rows x L positions whatever each row's length.
- "triton": the split-KV kernel (`asyncrl.rollout.kernels.decode_attention`), which reads each
  row's own length from a device tensor and nothing of a padding row (length 0). Its shapes do
  not depend on the lengths, so one CUDA graph per batch bucket serves every step.
"auto" is triton on CUDA (torch's CUDA builds ship Triton) and matmul elsewhere: Triton runs only
interpreted on the CPU (`TRITON_INTERPRET=1`, which the tests use), far slower than the matmuls.

Not here: the K/V write of the step's token (the forward's), the kernel itself, the graphs' buckets.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from typing import Literal

import torch

from asyncrl.config.names import DecodeAttention
from asyncrl.errors import ConfigError
from asyncrl.rollout.kernels import interpreting
from asyncrl.rollout.kv_cache import SlotKVCache

DecodeAttentionPath = Literal["matmul", "triton"]
PATHS: Counter[str] = Counter()
"""Decode steps by the attention path they ran (a CUDA graph counts once, when captured): tests read it."""


def resolve(choice: DecodeAttention, device: torch.device) -> DecodeAttentionPath:
    """The path `choice` means on `device`: "auto" is triton on CUDA when Triton is installed,
    else matmul. A forced triton off CUDA must run interpreted: a `ConfigError` otherwise."""
    has_triton = importlib.util.find_spec("triton") is not None
    if choice == "auto":
        return "triton" if device.type == "cuda" and has_triton else "matmul"
    if choice == "triton" and not has_triton:
        raise ConfigError("rollout.decode_attention=triton: triton is not installed; set rollout.decode_attention=auto")
    if choice == "triton" and device.type != "cuda" and not interpreting():
        raise ConfigError(f"rollout.decode_attention=triton on {device.type}: Triton runs on the CPU only interpreted "
                          "(TRITON_INTERPRET=1, tests only); set rollout.decode_attention=auto")
    return choice


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask → 0 / -inf once per step (SDPA would otherwise convert it in every layer)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """Decode attention as two batched matmuls over head-major cache views.

    q: (B, Hkv, G, D); keys/values: (B, Hkv, L, D) with contiguous rows; mask: (B, 1, 1, L)
    additive. Returns (B, Hkv, G, D). Softmax runs in float32, as HF's.
    """
    scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale).add_(mask)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values)


class StepAttention:
    """One decode step's attention: set up once (mask or lengths), then called per layer."""

    def __init__(self, path: DecodeAttentionPath, cache: SlotKVCache, positions: torch.Tensor, *, heads: int,
                 scale: float, lengths: torch.Tensor | None = None, length: int | None = None) -> None:
        """positions: (B,) each row's position (its token's K/V already written there).
        matmul: reads `length` positions of every row (None: the furthest row's, read from the
        device). triton: reads `lengths` (B,) per row (None: positions + 1; 0 for a padding row)."""
        PATHS[path] += 1
        self.path = path
        self.cache = cache
        self.scale = scale
        self.groups = heads // cache.kv_heads
        rows = positions.shape[0]
        if path == "matmul":
            self.length = int(positions.max()) + 1 if length is None else length
            # (B, 1, 1, L): each row sees its own keys 0..position; the rest of the view is padding.
            allowed = torch.arange(self.length, device=positions.device)[None] <= positions[:, None]
            self.mask = _additive_mask(allowed[:, None, None], cache.dtype)
        else:
            from asyncrl.rollout.kernels import decode_attention as split_kv  # Triton: imported when used

            self.kernel = split_kv.decode_attention
            self.lengths = positions + 1 if lengths is None else lengths
            programs = split_kv.target_programs(positions.device)
            self.splits = split_kv.split_count(rows, cache.kv_heads, cache.capacity, programs)

    def __call__(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: (B, H, D) of layer `layer` -> its attention output (B, H x D)."""
        b, _, head_dim = q.shape
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        if self.path == "triton":
            return self.kernel(q, keys, values, self.lengths, self.scale, self.splits).reshape(b, -1)
        # Grouped-query trick: the G query heads sharing a KV head become G query rows of that
        # head (same mask), so no repeat_interleave copy of the cache is needed.
        q = q.reshape(b, self.cache.kv_heads, self.groups, head_dim)
        n = self.length
        return _attend(q, keys[:b, :, :n], values[:b, :, :n], self.mask, self.scale).reshape(b, -1)
