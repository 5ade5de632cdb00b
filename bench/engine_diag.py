"""Where an engine run's time goes: the diagnostics of `bench/gpu_engine.py` (issue 24, deliverable 6).

- `StepLog` wraps the engine's step runner and records every step it runs: its kind (decode
  only, with a prefill, with KV moves), its wall time, its decode rows' context lengths and its
  prefill tokens. Summed per kind this is the step-kind breakdown; the prefill count is the
  number of steps that carried one.
- `own_mix_floor` replays every captured graph of a finished run (decode and prefill alike) and
  sums count x replay time: the time the run's own mix of steps takes when nothing but the graphs
  runs. What it leaves out, KV moves and host work, is the gap between it and the engine.
- `bandwidth_bound_s` is the memory-bandwidth bound of a step: the weights read once plus the
  real KV of its rows, at the device's HBM bandwidth.
- `kernels_per_decode_step` counts the device kernels of one replay of the engine's own decode
  graph, sampling included, with torch.profiler (on the CPU: the aten ops, the proxy the issue names).
- `capture_seconds` sums the decode and prefill graphs' capture time, which a steady run excludes.
- `KVReads` (kept by `StepLog`) sums the KV positions each decode step's attention reads, real
  and padded to the matmul path's length.

Timing only; correctness lives in tests/rollout and tests/gpu. Nothing here changes the engine.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncrl.rollout.graphs import attention_length

HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}
"""Peak memory bandwidth by device-name fragment (H100 SXM; a PCIe H100 is 2.0e12: pass --hbm-tbs)."""


def hbm_bytes_per_s(device_name: str) -> float | None:
    """The card's peak HBM bandwidth from its name, None when unknown (the bound is then omitted)."""
    return next((bw for frag, bw in HBM_BYTES_PER_S.items() if frag in device_name), None)


@dataclass
class KVReads:
    """Cached positions the decode attention reads, summed over decode steps: `real`, each row's
    own length (what the split-KV kernel reads); `padded`, the bucket's rows to the attention
    length (what the matmul path reads, padding rows included).

    Example: rows at positions 99 and 299 in bucket 2: real 100 + 300 = 400, padded 2 x 512 = 1,024."""

    steps: int = 0
    real: int = 0
    padded: int = 0

    def add(self, positions: Sequence[int], bucket: int, capacity: int) -> None:
        self.steps += 1
        self.real += sum(positions) + len(positions)
        self.padded += bucket * attention_length(max(positions), capacity)

    def bytes_per_step(self, bytes_per_token: int, reads_length: bool) -> dict[str, float]:
        """Mean KV-cache bytes (K and V, every layer) per decode step: `real`, `padded` and `read`
        (the path the forward takes: real where the kernel reads each row's length)."""
        per_step = bytes_per_token / max(self.steps, 1)
        real, padded = self.real * per_step, self.padded * per_step
        return {"real": real, "padded": padded, "read": real if reads_length else padded}


@dataclass
class StepLog:
    """Per-step records of one engine run, kept by wrapping `runner.run` (`attach`)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: Counter[str] = field(default_factory=Counter)
    kv_tokens_read: int = 0
    """Sum over decode steps of the real context of every decode row (positions + 1)."""
    decode_steps: int = 0
    prefill_tokens: int = 0
    kv_reads: KVReads = field(default_factory=KVReads)
    """The bucketed decode's reads, real and padded (`KVReads.bytes_per_step`)."""

    def attach(self, runner: Any) -> Callable[[], None]:
        """Record every `runner.run(plan)` from now on; returns the function that stops it."""
        original = runner.run

        def run(plan: Any) -> Any:
            start = time.perf_counter()
            result = original(plan)
            self.record(plan, time.perf_counter() - start)
            decode = runner.bucketed_decode
            if plan.decode_positions and decode is not None:
                bucket = decode.key(plan.decode_positions)[0]
                self.kv_reads.add(plan.decode_positions, bucket, runner.cache.capacity)
            return result

        runner.run = run
        return lambda: setattr(runner, "run", original)

    def record(self, plan: Any, seconds: float) -> None:
        kind = step_kind(plan)
        self.seconds[kind] += seconds
        self.counts[kind] += 1
        if plan.decode_positions:
            self.decode_steps += 1
            self.kv_tokens_read += sum(p + 1 for p in plan.decode_positions)
        self.prefill_tokens += sum(len(c) for c in plan.prefill_contexts)

    def summary(self) -> dict[str, Any]:
        total = sum(self.seconds.values())
        kinds = {k: dict(steps=self.counts[k], seconds=round(self.seconds[k], 4),
                         share=round(self.seconds[k] / total, 4) if total else 0.0,
                         ms_per_step=round(1e3 * self.seconds[k] / self.counts[k], 3)) for k in sorted(self.counts)}
        prefill_steps = sum(n for k, n in self.counts.items() if "prefill" in k)
        return dict(step_kinds=kinds, steps=sum(self.counts.values()), prefill_steps=prefill_steps,
                    decode_steps=self.decode_steps, prefill_tokens=self.prefill_tokens,
                    kv_tokens_read=self.kv_tokens_read, step_seconds=round(total, 4))


def step_kind(plan: Any) -> str:
    """'decode', 'decode+prefill', 'decode+moves', 'decode+prefill+moves', 'prefill', ...: what a step carried."""
    parts = [name for name, present in (("decode", plan.decode_positions), ("prefill", plan.prefill_contexts),
                                        ("moves", plan.moves)) if present]
    return "+".join(parts) or "empty"


def bandwidth_bound_s(weight_bytes: int, kv_bytes_per_token: int, kv_tokens: int, steps: int,
                      bytes_per_s: float) -> float:
    """Seconds to read the weights once per step and `kv_tokens` cached tokens in all, at `bytes_per_s`.

    Example: 1 GB of weights, 12 KiB of KV per token, 64 rows at context 542 in one step, 4.8 TB/s:
    (1e9 + 12288 * 64 * 542) / 4.8e12 = 0.297 ms."""
    return (weight_bytes * steps + kv_bytes_per_token * kv_tokens) / bytes_per_s


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, a tied embedding counted once (what a decode step reads)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """K and V of one token over every layer."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def graph_sets(runner: Any) -> list[Any]:
    """The runner's bucketed steps (decode, and prefill where it has buckets): objects with
    `steps` (a Counter of keys), `capture_s` and their graphs (`replay_s`)."""
    return [g for g in (getattr(runner, "bucketed_decode", None), getattr(runner, "bucketed_prefill", None))
            if g is not None]


def step_of(graphs: Any, key: Any) -> Callable[[], None]:
    """`key`'s step again: the decode's (its graph's replay on CUDA, else eager, sampling
    included), or a prefill graph's replay."""
    if hasattr(graphs, "step_of"):
        return graphs.step_of(key)
    assert graphs.graphs is not None, "replay times are a captured graph's"
    return graphs.graphs.replay_of(key)


def replay_s(graphs: Any, key: Any, iters: int) -> float:
    """Mean seconds of one replay of `key`'s step, for the own-mix floor. Replays rewrite the
    cache positions that step wrote: run it only after the engine is done with the cache."""
    return mean_seconds(step_of(graphs, key), iters, graphs.cache.device if graphs.capture else None)


def mean_seconds(step: Callable[[], None], iters: int, cuda: torch.device | None) -> float:
    """Mean seconds of `step` over `iters` calls after one warm-up; on `cuda`, synchronised around them."""
    step()
    if cuda is not None:
        torch.cuda.synchronize(cuda)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda is not None:
        torch.cuda.synchronize(cuda)
    return (time.perf_counter() - start) / iters


def capture_seconds(runner: Any) -> float:
    """Seconds spent capturing graphs so far, decode and prefill alike (a run's steady time excludes them)."""
    return sum(g.capture_s for g in graph_sets(runner))


def step_counts(runner: Any) -> list[Counter[Any]]:
    """Each graph set's steps per key so far (`own_mix_floor(since=...)` takes one taken before a run)."""
    return [Counter(g.steps) for g in graph_sets(runner)]


def own_mix_floor(runner: Any, iters: int, budget_s: float, since: list[Counter[Any]] | None = None) -> dict[str, Any]:
    """Sum over captured graphs of (times it ran since `since`, a `step_counts` taken before the
    run measured; else ever) x (its replay time), replayed `iters` times each, the most-run first,
    until `budget_s` is spent; graphs left untimed are counted at the mean time of the timed ones
    of their set and reported. `own_mix_steps`: the steps counted."""
    start = time.perf_counter()
    floor_s, timed, untimed, counted = 0.0, 0, 0, 0
    sets = graph_sets(runner)
    for graphs, before in zip(sets, since or [Counter() for _ in sets], strict=True):
        times: list[float] = []
        left: list[int] = []
        ran = graphs.steps - before
        counted += sum(ran.values())
        for key, count in ran.most_common():
            if time.perf_counter() - start < budget_s:
                with torch.inference_mode():  # the engine's tensors are inference tensors
                    seconds = replay_s(graphs, key, iters)
                times.append(seconds)
                floor_s += count * seconds
                timed += 1
            else:
                left.append(count)
        if left and times:
            floor_s += sum(left) * statistics.fmean(times)
        untimed += len(left)
    return dict(own_mix_floor_s=floor_s, own_mix_steps=counted, graphs_timed=timed, graphs_untimed=untimed,
                own_mix_floor_measure_s=time.perf_counter() - start)


def kernels_per_decode_step(graphs: Any, key: tuple[int, int], device: torch.device) -> dict[str, Any]:
    """Device kernels of one replay of the engine's own decode graph for `key` (sampling inside it
    included), counted by torch.profiler; where the profiler sees no kernel inside a replay, the
    same step's calls run eagerly (what the graph captured), and `kernels_counted_on` says which.
    On the CPU (nothing captured): the aten ops the eager step dispatches, the proxy the issue names."""
    if device.type != "cuda":
        events = profiled(graphs.step_of(key), device)
        return dict(aten_ops_per_decode_step=sum(1 for e in events if e.name.startswith("aten::")
                                                 and e.cpu_parent is None), kernels_counted_on="eager step (CPU)")
    kernels = cuda_kernels(profiled(graphs.step_of(key), device))
    counted_on = "graph replay"
    if not kernels:
        kernels, counted_on = cuda_kernels(profiled(graphs.step_of(key, eager=True), device)), "eager step"
    return dict(kernels_per_decode_step=kernels, kernels_counted_on=counted_on)


def profiled(step: Callable[[], None], device: torch.device) -> list[Any]:
    """The profiler's events of one call of `step`, after one unprofiled call (lazy initialisation)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.inference_mode():  # the engine's tensors are inference tensors
        step()
        with profile(activities=activities) as prof:
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    return list(prof.events())


def cuda_kernels(events: list[Any]) -> int:
    """Kernels among a profile's device events (copies and memsets are not kernels)."""
    return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset", "memcpy", "memset")))
