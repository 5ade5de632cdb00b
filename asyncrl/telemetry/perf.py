"""`perf/*` step metrics under verl's names: throughput, tokens, step time, memory, MFU.

Pure functions over a step's metrics and token counts, following verl
(`verl.trainer.ppo.metric_utils.compute_throughout_metrics`, `verl.utils.flops_counter`):
- `perf/total_num_tokens`: prompt + response tokens of the trained sequences;
- `perf/time_per_step`: `timing_s/step`; `perf/throughput`: tokens / (time x devices);
- `perf/mfu/actor`: the update's model FLOPs per second over the devices' peak. FLOPs are
  6 x dense params x tokens (forward 2, backward 4) plus the attention term
  12 x sum(seqlen^2) x head_dim x heads x layers, per PPO epoch; dense params are the linear
  layers plus embedding and head (vocab x hidden x 2), as verl counts them, LoRA or not;
  `executed_training_flops` counts what this trainer runs instead (no embedding term, the head
  on response tokens only, causal attention pairs), the numerator of the benches' second MFU;
- `perf/max_memory_allocated_gb` / `perf/max_memory_reserved_gb` (CUDA's peaks), or on CPU the
  process's peak RSS as `perf/max_memory_allocated_gb`; `perf/cpu_memory_used_gb` is the
  process's current RSS (verl reports the machine's used memory there).

MFU is reported only on a GPU in `PEAK_BF16_FLOPS`: a CPU has no standard peak to compare with.
Not here: timing the stages (`telemetry.metrics.timer`) or deciding when to log.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from asyncrl.scheduling.micro_budget import ModelShape
from asyncrl.types import Group

if TYPE_CHECKING:
    from asyncrl.config.schema import Config

GB = 1024**3

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s per device, as verl's get_device_flops.
PEAK_BF16_FLOPS = {"H100": 989e12, "H800": 989e12, "H200": 989e12, "H20": 148e12,
                   "A100": 312e12, "A800": 312e12}


def dense_params(shape: ModelShape) -> int:
    """Parameters every token passes through (verl's dense_N): per layer the gated MLP
    (3 x hidden x intermediate) and q/k/v/o projections, plus embedding and head.

    Example: hidden 8, intermediate 16, 2 layers, 2 heads (2 kv), head_dim 4, vocab 10:
    mlp 384 + attn 8 x (8 + 8 + 8 + 8) = 256 per layer -> 2 x 640 + 160 = 1440."""
    return layer_params(shape) + 2 * shape.vocab_size * shape.hidden_size


def layer_params(shape: ModelShape) -> int:
    """The decoder layers' matrix parameters: gated MLP and q/k/v/o projections (1280 above)."""
    s = shape
    q = s.num_heads * s.head_dim
    kv = s.num_kv_heads * s.head_dim
    mlp = 3 * s.hidden_size * s.intermediate_size
    attn = s.hidden_size * (q + 2 * kv + q)
    return (mlp + attn) * s.num_layers


def training_flops(shape: ModelShape, seq_lens: Sequence[int]) -> float:
    """FLOPs of one forward + backward over these sequences (verl's estimate).

    Example (the shape above, sequences of 3 and 5 tokens): 6 x 1440 x 8 + 12 x 34 x 4 x 2 x 2
    = 69120 + 6528 = 75648."""
    attention = 12 * sum(n * n for n in seq_lens) * shape.head_dim * shape.num_heads * shape.num_layers
    return 6.0 * dense_params(shape) * sum(seq_lens) + attention


def executed_training_flops(shape: ModelShape, seq_lens: Sequence[int], response_lens: Sequence[int],
                            recompute: bool = False) -> float:
    """FLOPs a forward + backward of this trainer executes over these sequences, unlike verl's
    estimate: no embedding term (a lookup, and its backward a scatter-add), the head only on the
    response tokens it predicts (`logits_to_keep`), causal attention over s(s+1)/2 token pairs per
    row (what a causal kernel computes) instead of s^2. `recompute` (activation checkpointing):
    the layers' forward runs twice, 8 FLOPs per parameter and token instead of 6. Full
    fine-tuning: a LoRA model skips its frozen weights' gradients, which this still counts.

    Example (the shape above, sequences of 3 and 5 tokens with responses of 1 and 2):
    layers 6 x 1280 x 8 = 61440, head 6 x 10 x 8 x 3 = 1440, attention 12 x (6 + 15) x 4 x 2 x 2
    = 4032: 66912 (verl's: 75648); recomputed: 8 x 1280 x 8 + 1440 + 16 x 21 x 16 = 88736."""
    per_token = 8.0 if recompute else 6.0
    pairs = sum(n * (n + 1) // 2 for n in seq_lens)
    attention = 2 * per_token * pairs * shape.head_dim * shape.num_heads * shape.num_layers
    head = 6.0 * shape.vocab_size * shape.hidden_size * sum(response_lens)
    return per_token * layer_params(shape) * sum(seq_lens) + head + attention


def peak_flops(device_name: str) -> float | None:
    """The bf16 peak of a device named like "NVIDIA H100 80GB HBM3"; None when not in the table
    (the longest matching key wins: "H200" before "H20")."""
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(flops: float, seconds: float, peak: float, n_devices: int = 1) -> float:
    """Model FLOPs utilisation: achieved FLOP/s per device over the peak."""
    return flops / max(seconds, 1e-12) / n_devices / peak


def actor_mfu(shape: ModelShape | None, seq_lens: Sequence[int], seconds: float, passes: int,
              device_name: str | None, n_devices: int = 1) -> dict[str, float]:
    """`perf/mfu/actor` of an update that made `passes` forward + backward passes (PPO epochs)
    over these sequences in `seconds`; empty when the FLOPs or the device's peak are unknown."""
    peak = peak_flops(device_name) if device_name else None
    if shape is None or peak is None or seconds <= 0:
        return {}
    return {"perf/mfu/actor": mfu(training_flops(shape, seq_lens) * passes, seconds, peak, n_devices)}


def cuda_name(device: torch.device) -> str | None:
    """The GPU's name ("NVIDIA H100 80GB HBM3") or None off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def throughput_metrics(seq_lens: Sequence[int], step_s: float, n_devices: int) -> dict[str, float]:
    """verl's compute_throughout_metrics: tokens of the step, its time, tokens/s per device."""
    total = float(sum(seq_lens))
    return {"perf/total_num_tokens": total, "perf/time_per_step": step_s,
            "perf/throughput": total / (max(step_s, 1e-12) * n_devices)}


def seq_lens_of(groups: Sequence[Group]) -> list[int]:
    """Prompt + response tokens of every trajectory (verl's global_token_num)."""
    return [len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories]


def run_devices(cfg: Config) -> int:
    """GPUs the run holds (the trainer's, plus the rollout's in the decoupled pipelines); 1 on a
    CPU machine, so throughput is then tokens/s of the machine."""
    trainer = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    rollout = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if cfg.pipeline != "colocated" else 0
    return max(trainer + rollout, 1)


def step_perf(metrics: Mapping[str, float], groups: Sequence[Group], n_devices: int) -> dict[str, float]:
    """The throughput metrics of a step from its `timing_s/step` and trained groups (none when
    either is missing: a step with no update, a validation-only log)."""
    step_s = metrics.get("timing_s/step")
    lens = seq_lens_of(groups)
    return throughput_metrics(lens, step_s, n_devices) if step_s is not None and lens else {}


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Peak memory of this process on `device` (CUDA's allocator, else peak RSS) and its RSS now."""
    out = {"perf/cpu_memory_used_gb": _rss_bytes() / GB}
    if device.type == "cuda":
        out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GB
        out["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GB
    else:
        out["perf/max_memory_allocated_gb"] = _peak_rss_bytes() / GB
    return out


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return _peak_rss_bytes()
