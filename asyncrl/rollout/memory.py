"""How large a static KV cache the device can hold (`rollout.gpu_memory_utilization`).

On CUDA with static decode the engine allocates its KV cache once, when it is built:
`max_num_seqs` slots of `max_model_len` positions each, every layer's K and V. How much of the
device it may fill is a fraction, vLLM's (and verl's) `gpu_memory_utilization`:

    available = fraction x total - in use - reserve
    slots     = min(max_num_seqs, available // (max_model_len x bytes per token))

"In use" is `total - free` from `cudaMemGetInfo` after `torch.cuda.empty_cache()`: everything
already on the device, from any process or thread: the engine's own weights, a colocated
trainer's model, other engines built before this one. So once the cache is allocated the device
holds at most `fraction x total`; the rest is left to what comes later (a trainer's optimizer
state, activations). The reserve is `activation_reserve_bytes`: what a step allocates besides
the cache (an estimate, documented there). Fewer slots than `max_num_seqs` lower how many
sequences the scheduler runs at once; not even one raises `ConfigError` with the numbers.

`plan_kv_cache` and `activation_reserve_bytes` are pure (tested with injected numbers on the
CPU); `device_memory` is the one call that reads a device. Not here: allocating the cache
(`SlotKVCache.allocate`), a paged cache (slots are fixed-size: a short sequence still holds
`max_model_len` positions), the CPU (its cache grows with the batch, unbounded by memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.errors import ConfigError

SAMPLING_COPIES = 10
"""(rows, vocab) float32 tensors alive at once in a step: logits, scaled logits, log-softmax,
probabilities, their CDF, and under top-p a sort (values + int64 indices), a mask and the
renormalised mass (measured by counting the sampler's live tensors, rounded up)."""
PREFILL_ACTIVATIONS = 4
"""Bytes per element assumed for prefill activations: float32, an upper bound for bf16 models
whose norms and softmax run in float32 anyway."""
SLACK_BYTES = 256 * 2**20
"""cuBLAS workspaces, the CUDA-graph pool's fragmentation, allocator rounding."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that set its activation memory."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVPlan:
    """What the static cache gets: `slots` x `capacity` positions, `kv_bytes` in all."""

    slots: int
    capacity: int
    kv_bytes: int
    available_bytes: int
    """fraction x total - in use - reserve: the most the cache may take."""


def activation_reserve_bytes(shape: ModelShape, *, max_num_seqs: int, max_model_len: int,
                             max_prefill_tokens: int) -> int:
    """Memory a step allocates besides the KV cache, by an upper-bound estimate.

    - sampling: `max_num_seqs x vocab x 4 B x SAMPLING_COPIES` (every row of a step is sampled
      over the full vocabulary in float32);
    - decode: per row, the logits before their float32 copy (counted at 4 B) and the float32
      attention scores of every head over `max_model_len` positions (inside the CUDA graphs'
      pool);
    - prefill: the largest prefill (`max(max_prefill_tokens, max_model_len)` tokens: one
      admission is always allowed however long) times one layer's live activations per token,
      `4 x intermediate + 8 x hidden + 6 x (q + k + v width)` elements at 4 B (layers run one
      after another, so one layer's worth is alive);
    - `SLACK_BYTES`.

    Example: Qwen2-0.5B (vocab 151936, hidden 896, intermediate 4864, 14/2 heads of 64), 64
    rows, max_model_len 2304, max_prefill_tokens 4096: sampling 389 MB, decode 47 MB, prefill
    549 MB, slack 268 MB: 1.25 GB (2.4 GiB at 256 rows).
    """
    s = shape
    sampling = max_num_seqs * s.vocab_size * 4 * SAMPLING_COPIES
    decode = max_num_seqs * (s.vocab_size * 4 + s.num_heads * max_model_len * 4)
    qkv_width = (s.num_heads + 2 * s.kv_heads) * s.head_dim
    per_token = (4 * s.intermediate_size + 8 * s.hidden_size + 6 * qkv_width) * PREFILL_ACTIVATIONS
    prefill = max(max_prefill_tokens, max_model_len) * per_token
    return sampling + decode + prefill + SLACK_BYTES


def plan_kv_cache(*, free_bytes: int, total_bytes: int, fraction: float, bytes_per_token: int,
                  max_model_len: int, max_num_seqs: int, reserve_bytes: int) -> KVPlan:
    """Slots of `max_model_len` positions that fit in `fraction` of the device (module docstring).

    Example: total 80 GiB, free 78 GiB (2 GiB in use), fraction 0.5, reserve 1 GiB: 37 GiB
    available; at 12 KiB per token and max_model_len 2048 (24 MiB a slot) that is 1578 slots,
    so max_num_seqs=256 keeps all 256 (6 GiB). With fraction 0.05 (4 GiB, 1 GiB available) it
    gets 42 slots. Raises `ConfigError` naming `rollout.gpu_memory_utilization` when not one
    slot fits.
    """
    assert 0 < fraction <= 1 and bytes_per_token > 0 and max_model_len > 0 and max_num_seqs > 0
    in_use = total_bytes - free_bytes
    available = int(fraction * total_bytes) - in_use - reserve_bytes
    per_slot = bytes_per_token * max_model_len
    slots = min(max_num_seqs, max(available, 0) // per_slot)
    if slots < 1:
        raise ConfigError(
            f"rollout.gpu_memory_utilization={fraction:g} leaves {_gib(available)} GiB for the KV cache "
            f"({fraction:g} x {_gib(total_bytes)} GiB total - {_gib(in_use)} GiB in use - "
            f"{_gib(reserve_bytes)} GiB reserved for activations), less than one sequence of "
            f"{max_model_len} tokens ({_gib(per_slot)} GiB); raise rollout.gpu_memory_utilization "
            "or lower data.max_prompt_length + data.max_response_length")
    return KVPlan(slots=slots, capacity=max_model_len, kv_bytes=slots * per_slot, available_bytes=available)


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device after returning this process's cached blocks to it;
    None for any other device (the CPU sizes nothing)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"
