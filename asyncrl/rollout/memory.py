"""How large a static KV cache the device can hold (`rollout.gpu_memory_utilization`).

On CUDA with `rollout.cuda_graphs` the engine allocates its KV cache once, when it is built:
`max_num_seqs` slots of `max_model_len` positions each, every layer's K and V. How much of the
device it may take is a fraction, vLLM's (and verl's) `gpu_memory_utilization`:

    available = min(fraction x total - held by this process, free) - reserve
    slots     = min(max_num_seqs, available // (max_model_len x bytes per token))

"Held by this process" is what torch's allocator holds on the device after
`torch.cuda.empty_cache()`: the engine's weights, and in a run with everything in one process
(`backend=local`) the colocated trainer's model too, so there the fraction bounds both and the
rest of the device is left to what comes later (the trainer's optimizer state, activations).
Memory other processes hold (a trainer process capped at `1 - fraction` under
`backend=processes`, another job) is not charged to this engine's share, but `free`
(`cudaMemGetInfo`) bounds it: the engine never plans more than is free now. The CUDA context
(a few hundred MB) is outside torch's allocator and not counted. The reserve is
`activation_reserve_bytes`: what a step allocates besides the cache (an estimate, documented
there). Fewer slots than `max_num_seqs` lower how many sequences the scheduler runs at once; not
even one raises `ConfigError` with the numbers.

`plan_kv_cache` and `activation_reserve_bytes` are pure (tested with injected numbers on the
CPU); `device_memory` is the one call that reads a device. Not here: allocating the cache
(`SlotKVCache.allocate`), a paged cache (slots are fixed-size: a short sequence still holds
`max_model_len` positions), the CPU (its cache grows with the batch, unbounded by memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.errors import ConfigError
from asyncrl.scheduling.micro_budget import ModelShape

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
class DeviceMemory:
    """Bytes of one device: free (any process), total, held by this process's torch allocator."""

    free: int
    total: int
    held: int


@dataclass(frozen=True)
class KVPlan:
    """What the static cache gets: `slots` x `capacity` positions, `kv_bytes` in all."""

    slots: int
    capacity: int
    kv_bytes: int
    available_bytes: int
    """min(fraction x total - held, free) - reserve: the most the cache may take."""


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
    qkv_width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    per_token = (4 * s.intermediate_size + 8 * s.hidden_size + 6 * qkv_width) * PREFILL_ACTIVATIONS
    prefill = max(max_prefill_tokens, max_model_len) * per_token
    return sampling + decode + prefill + SLACK_BYTES


def plan_kv_cache(memory: DeviceMemory, *, gpu_memory_utilization: float, bytes_per_token: int, max_model_len: int,
                  max_num_seqs: int, reserve_bytes: int) -> KVPlan:
    """Slots of `max_model_len` positions that fit in this engine's share (module docstring).

    Example: total 80 GiB, this process holding 2 GiB, 78 GiB free, fraction 0.5, reserve 1 GiB:
    min(40 - 2, 78) - 1 = 37 GiB; at 12 KiB per token and max_model_len 2048 (24 MiB a slot)
    that is 1578 slots, so max_num_seqs=256 keeps all 256 (6 GiB). With fraction 0.05 (4 GiB,
    1 GiB available) it gets 42 slots; with another process holding 60 GiB (18 GiB free), 725.
    Raises `ConfigError` naming `rollout.gpu_memory_utilization` when not one slot fits.
    """
    fraction = gpu_memory_utilization  # the share of the device (module docstring)
    assert 0 < fraction <= 1 and bytes_per_token > 0 and max_model_len > 0 and max_num_seqs > 0
    m = memory
    share = int(fraction * m.total) - m.held
    available = min(share, m.free) - reserve_bytes
    per_slot = bytes_per_token * max_model_len
    slots = min(max_num_seqs, max(available, 0) // per_slot)
    if slots < 1:
        fix = "raise rollout.gpu_memory_utilization" if share <= m.free else "free the device (other processes hold it)"
        raise ConfigError(
            f"rollout.gpu_memory_utilization={fraction:g} leaves {_gib(available)} GiB for the KV cache "
            f"(min({fraction:g} x {_gib(m.total)} GiB total - {_gib(m.held)} GiB held by this process, "
            f"{_gib(m.free)} GiB free) - {_gib(reserve_bytes)} GiB reserved for activations), less than "
            f"one sequence of {max_model_len} tokens ({_gib(per_slot)} GiB); {fix} or lower "
            "data.max_prompt_length + data.max_response_length")
    return KVPlan(slots=slots, capacity=max_model_len, kv_bytes=slots * per_slot, available_bytes=available)


def device_memory(device: torch.device) -> DeviceMemory | None:
    """A CUDA device's memory after returning this process's cached blocks to it; None for any
    other device (the CPU sizes nothing)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(free=int(free), total=int(total), held=int(torch.cuda.memory_reserved(device)))


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"
