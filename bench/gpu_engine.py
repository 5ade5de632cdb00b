"""Benchmark: TorchEngine tokens/s on one GPU, against its own CUDA-graph floor and HF `generate`.

Workload (issue 13): a Qwen2-0.5B-shaped model (transformers Qwen2Config: hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings; random weights, bf16),
256 requests, prompts of 64..256 random tokens, response lengths lognormal (median 256, sigma
1.0, seed 0) capped at 2048, EOS ignored (`SamplingParams(ignore_eos=True)`, so each response
is exactly its drawn `max_tokens`), temperature 1, no top-k/p.

Per max batch (`--batches`, 64 and 256):
- floor: after the engine's runs, the engine's own decode step of that many rows (its forward as
  the run's settings built it, `--off` included, and the sampling inside its graph), every row at
  the workload's mean context length (token-weighted: the mean context a generated token sees),
  replayed from its CUDA graph; tokens/s = batch / step time. No prefill, no scheduling, no long
  tail: the most this decode path could do at a full batch.
- engine: `TorchEngine` (CUDA graphs, KV cache sized by `gpu_memory_utilization`) on every
  request at once: generated tokens / wall time. The first run on an engine captures its graphs
  (decode and prefill, timed); the headline, `engine_tokens_per_s`, is the steady state: the last
  run's tokens / (its wall time - the decode and prefill capture time spent in it). With
  `--engine-runs 2` the second run replays only, which checks that subtraction.
- HF generate: `--hf-requests` requests in one left-padded batch, lengths capped at `--hf-cap`,
  `min_new_tokens = max_new_tokens` (EOS ignored), stopped after `--hf-time-s` seconds
  (`max_time`, 5 s on CUDA); useful tokens (each row's requested tokens reached) / wall time.
- Where the engine's time goes (`bench/engine_diag.py`): the steps by kind (decode only, with a
  prefill, with KV moves: count, seconds, ms per step) and the number that carried a prefill;
  the own-mix floor (every captured graph replayed, times the number of steps that ran it in the
  last run: what that run's own mix of steps costs with no KV moves and no host work); kernels per
  decode step (torch.profiler over a replay of the floor's graph; aten ops on the CPU); the
  memory-bandwidth bound of the run's decode steps
  (weights once per step plus each row's real KV, at the card's HBM bandwidth); time to first
  token p50/p99.
- `--off PART[,PART]` (or `all`) turns issue 24's engine parts off (`PARTS`), for A/B runs of
  today's path against the new one; `--skip-hf` leaves the HF baseline out.

Targets (issue 24, H200): at least 30K tokens/s at batch 256 and 15K at 64 (floors 15K and 6K), at
least 80% of the own-mix floor, the 256-row decode graph within 3x of its bandwidth bound. Every
result is written as it finishes (after HF, after each batch).

    python bench/gpu_engine.py --device cuda      # ~1.5 min on one H100, -> bench/results/gpu_engine.json
    python bench/gpu_engine.py --device cpu       # a small model, few requests, < 2 min,
                                                  # -> bench/results/gpu_engine_cpu.json

On the CPU nothing is captured: the floor is the same decode step run eagerly, the engine runs
its static path eagerly, and the small model replaces the 0.5B one. Nothing is downloaded.
It measures throughput only; correctness lives in tests/rollout and tests/gpu.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's asyncrl, without PYTHONPATH

from asyncrl.compute import compute_thread, pin_threads  # noqa: E402
from asyncrl.config.schema import RolloutConfig  # noqa: E402
from asyncrl.rollout import TorchEngine, engine_settings, run_sync  # noqa: E402
from asyncrl.rollout.sampler import SamplingMode  # noqa: E402
from asyncrl.types import GenerationRequest, SamplingParams, Trajectory  # noqa: E402
from bench.engine import left_padded  # noqa: E402
from bench.engine_diag import (  # noqa: E402
    StepLog,
    bandwidth_bound_s,
    capture_seconds,
    hbm_bytes_per_s,
    kernels_per_decode_step,
    kv_bytes_per_token,
    own_mix_floor,
    replay_s,
    step_counts,
    weight_bytes,
)

PARTS: dict[str, dict[str, Any]] = {
    "admission": dict(admit_min_free_slots=1),  # admit at every free slot, as before
    "packed_prefill": dict(packed_prefill="off"),  # padded, eager prefill
    "fused_decode": dict(fused_decode="off"),  # HF's modules, unfused
    "decode_attention": dict(decode_attention="matmul"),  # rows padded to a power-of-two length
}
"""Issue 24's engine parts, each by the `rollout.*` keys that turn it off (today's path); `--off`
names some of them, `--off all` every one. KV moves in one operation have no switch (the stacked
cache replaced the per-buffer copies)."""

MODELS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "qwen2-small": dict(vocab_size=4096, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=384, tie_word_embeddings=True),
}
CUDA_DEFAULTS = dict(model="qwen2-0.5b", num_requests=256, prompt_min=64, prompt_max=256, median=256.0,
                     cap=2048, batches="64,256", hf_requests=64, hf_cap=512, hf_time_s=5.0, engine_runs=1,
                     out="bench/results/gpu_engine.json")
CPU_DEFAULTS = dict(model="qwen2-small", num_requests=64, prompt_min=16, prompt_max=64, median=32.0,
                    cap=256, batches="16,64", hf_requests=32, hf_cap=64, hf_time_s=20.0, engine_runs=2,
                    out="bench/results/gpu_engine_cpu.json")
START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {message}", flush=True)


def build_model(name: str, device: torch.device) -> Qwen2ForCausalLM:
    """Random weights, initialised on the device (seconds for 0.5B on a GPU), bf16 there."""
    torch.manual_seed(0)
    with device:
        model = Qwen2ForCausalLM(Qwen2Config(**MODELS[name]))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return model.to(dtype=dtype).eval()


def workload(args: argparse.Namespace, vocab: int) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.exp(math.log(args.median) + args.sigma * torch.randn(args.num_requests, generator=g))
    reqs = []
    for i, length in enumerate(lengths.round().clamp(1, args.cap).long().tolist()):
        plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=g))
        prompt = tuple(torch.randint(1, vocab, (plen,), generator=g).tolist())
        params = SamplingParams(max_tokens=length, temperature=1.0, ignore_eos=True)
        reqs.append(GenerationRequest(f"r{i}", prompt, params))
    return reqs


def mean_context(reqs: list[GenerationRequest]) -> int:
    """The context the average generated token attends to: sum over tokens of (prompt + i)."""
    total = sum(len(r.prompt_ids) * r.params.max_tokens + r.params.max_tokens * (r.params.max_tokens - 1) // 2
                for r in reqs)
    return round(total / sum(r.params.max_tokens for r in reqs))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def engine_floor(runner: Any, batch: int, context: int, params: SamplingParams, iters: int) -> dict[str, Any]:
    """The engine's own full-batch decode step, every row at position `context - 1`, replayed from
    its graph (its forward as the run's settings built it, the sampling inside the graph; eager on
    the CPU): batch / step time, and the kernels one replay launches. Run after the engine's runs:
    it writes cache positions and counts a step of its own."""
    graphs = runner.bucketed_decode
    rows = min(batch, runner.max_num_seqs)
    positions = [context - 1] * rows
    mode = SamplingMode.of([params] * rows)
    with torch.inference_mode():
        runner.cache.reserve(rows, context)  # the CPU's cache grows with its rows; a GPU's is sized already
        graphs(positions, mode)  # captured here if the run never had a full batch (CUDA)
        key = graphs.key(positions)
        seconds = replay_s(graphs, key, iters)
    forward = runner.forward
    return dict(floor_step_ms=seconds * 1e3, floor_tokens_per_s=rows / seconds, floor_rows=rows, floor_key=list(key),
                floor_forward=dict(fused=forward.fused_decode, attention=forward.decode_attention),
                **kernels_per_decode_step(graphs, key, runner.device))


def run_engine(model: Qwen2ForCausalLM, reqs: list[GenerationRequest], batch: int, device: torch.device,
               args: argparse.Namespace, compute: Executor) -> dict[str, Any]:
    """Every request at once, `args.engine_runs` times on one engine (the first captures the
    graphs), with the parts named by `args.off` turned off; then the diagnostics of the last run."""
    max_model_len = max(len(r.prompt_ids) + r.params.max_tokens for r in reqs)
    rollout = RolloutConfig(max_num_seqs=batch, kv_budget_tokens=max_model_len * batch, **off_settings(args.off))
    # cuda_graphs on the CPU too: the same static path, run eagerly there
    settings = replace(engine_settings(rollout, device=device, seed=0, max_model_len=max_model_len), cuda_graphs=True)
    engine = TorchEngine(model, 0, settings, executor=compute)
    runner = engine._runner
    graphs = runner.bucketed_decode
    assert graphs is not None, "the static path needs the fast forward"
    useful = sum(r.params.max_tokens for r in reqs)
    walls, steady = [], []
    for run in range(args.engine_runs):
        capture_before, counts_before = capture_seconds(runner), step_counts(runner)
        steps = StepLog()
        detach = steps.attach(runner)
        t0 = time.perf_counter()
        outs = run_sync(engine, reqs)
        walls.append(time.perf_counter() - t0)
        detach()
        steady.append(walls[-1] - (capture_seconds(runner) - capture_before))  # decode and prefill captures
        assert [len(o.response_ids) for o in outs] == [r.params.max_tokens for r in reqs]
        log(f"  engine batch {batch} run {run}: {walls[-1]:.1f} s ({steady[-1]:.1f} s without captures), "
            f"{useful / steady[-1]:,.0f} tok/s, {steps.decode_steps} decode steps, "
            f"{steps.summary()['prefill_steps']} with prefill, {graphs.captures} graphs captured in "
            f"{graphs.capture_s:.1f} s")
    kv = runner.kv_plan
    row = dict(engine_tokens_per_s=useful / steady[-1], engine_seconds=steady[-1],
               engine_first_run_tokens_per_s=useful / walls[0], engine_first_run_seconds=walls[0],
               captures=graphs.captures, capture_s=capture_seconds(runner),
               mean_decode_rows=useful / max(steps.decode_steps, 1),
               kv_slots=runner.max_num_seqs, kv_cache_gib=None if kv is None else kv.kv_bytes / 2**30,
               max_model_len=max_model_len, **steps.summary(), **first_token_percentiles(outs))
    reads = steps.kv_reads.bytes_per_step(runner.cache.bytes_per_token, runner.forward.decode_attention == "triton")
    row.update({f"kv_bytes_per_step_{k}": v for k, v in reads.items()})  # the last run's: real, padded, read
    # the last run's own mix of steps (counts since it started), then the full-batch floor, both on its graphs
    row.update(on(compute, own_mix_floor, runner, args.floor_iters // 10 or 1, args.floor_budget_s, counts_before))
    row["engine_vs_own_mix_floor"] = row["own_mix_floor_s"] / steady[-1] if row["own_mix_floor_s"] else None
    row.update(on(compute, engine_floor, runner, batch, mean_context(reqs), reqs[0].params, args.floor_iters))
    if args.hbm_bytes_per_s:
        dtype = next(model.parameters()).dtype
        row["bandwidth_bound_s"] = bandwidth_bound_s(weight_bytes(model), kv_bytes_per_token(model, dtype),
                                                     steps.kv_tokens_read, steps.decode_steps, args.hbm_bytes_per_s)
    engine.close()
    return row


def off_settings(parts: list[str]) -> dict[str, Any]:
    """The `rollout.*` keys that turn the named parts off."""
    overrides: dict[str, Any] = {}
    for part in parts:
        overrides.update(PARTS[part])
    return overrides


def first_token_percentiles(outs: list[Trajectory]) -> dict[str, float | None]:
    """Time to first token (the generate call to the first sampled token), p50 and p99 over the run's requests."""
    ttft = sorted(t for o in outs if (t := o.timings.get("first_token_s")) is not None)
    if not ttft:
        return dict(ttft_p50_s=None, ttft_p99_s=None)
    pick = lambda q: ttft[min(len(ttft) - 1, round(q * (len(ttft) - 1)))]  # noqa: E731
    return dict(ttft_p50_s=pick(0.5), ttft_p99_s=pick(0.99))


def run_hf(model: Qwen2ForCausalLM, reqs: list[GenerationRequest], cap: int, time_s: float,
           device: torch.device) -> dict[str, Any]:
    """One left-padded batch generating to its longest (capped) request, stopped after `time_s`."""
    lengths = [min(r.params.max_tokens, cap) for r in reqs]
    ids, mask = left_padded(reqs)
    new = max(lengths)
    with torch.inference_mode():  # warm-up: CUDA context, cuBLAS handles, kernels
        model.generate(ids[:2].to(device), attention_mask=mask[:2].to(device), max_new_tokens=2, min_new_tokens=2,
                       do_sample=True, top_k=0, pad_token_id=0)
    synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                             min_new_tokens=new, do_sample=True, top_k=0, temperature=1.0, pad_token_id=0,
                             max_time=time_s)
    synchronize(device)
    seconds = time.perf_counter() - t0
    steps = out.shape[1] - ids.shape[1]
    useful = sum(min(n, steps) for n in lengths)
    return dict(hf_tokens_per_s=useful / seconds, hf_seconds=seconds, hf_requests=len(reqs),
                hf_steps=steps, hf_stopped_by_time=steps < new, hf_useful_tokens=useful)


def on(compute: Executor, fn: Callable[..., Any], *args: Any) -> Any:
    """Run on the bench's one compute thread (`asyncrl.compute`: one OpenMP team on the CPU)."""
    return compute.submit(fn, *args).result()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model", choices=list(MODELS))
    ap.add_argument("--num-requests", type=int)
    ap.add_argument("--prompt-min", type=int)
    ap.add_argument("--prompt-max", type=int)
    ap.add_argument("--median", type=float)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--cap", type=int)
    ap.add_argument("--batches", help="comma list of max batch sizes (max_num_seqs)")
    ap.add_argument("--engine-runs", type=int, help="runs per engine: the first captures, the last counts")
    ap.add_argument("--floor-iters", type=int, default=100)
    ap.add_argument("--hf-requests", type=int)
    ap.add_argument("--hf-cap", type=int, help="HF responses capped at this many tokens")
    ap.add_argument("--hf-time-s", type=float, help="HF generate stops after this long")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the compute thread (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--off", default="", help=f"comma list of engine parts to turn off, or 'all': {', '.join(PARTS)}")
    ap.add_argument("--floor-budget-s", type=float, default=20.0,
                    help="time spent replaying graphs for the own-mix floor")
    ap.add_argument("--hbm-tbs", type=float, help="HBM bandwidth in TB/s (default: from the device name)")
    ap.add_argument("--skip-hf", action="store_true", help="no HF generate baseline (an A/B run of the engine)")
    ap.add_argument("--out")
    args = ap.parse_args()
    defaults = CUDA_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu")
    args.off = list(PARTS) if args.off == "all" else [p for p in args.off.split(",") if p]
    if unknown := [p for p in args.off if p not in PARTS]:
        raise SystemExit(f"--off {','.join(unknown)}: no such engine part; the parts are: {', '.join(PARTS)}")
    name = torch.cuda.get_device_name(args.device) if args.device == "cuda" else ""
    args.hbm_bytes_per_s = args.hbm_tbs * 1e12 if args.hbm_tbs else hbm_bytes_per_s(name)
    return args


def one_batch(model: Qwen2ForCausalLM, reqs: list[GenerationRequest], batch: int, device: torch.device,
              args: argparse.Namespace, compute: Executor) -> dict[str, Any]:
    """The floor, its bandwidth bound and the engine at one max batch: one result row."""
    context = mean_context(reqs)
    row: dict[str, Any] = dict(batch=batch, off=args.off, mean_context=context,
                               useful_tokens=sum(r.params.max_tokens for r in reqs))
    row.update(run_engine(model, reqs, batch, device, args, compute))
    if args.hbm_bytes_per_s:  # the full-batch graph against its bound (issue 24: within 3x)
        kv_token = kv_bytes_per_token(model, next(model.parameters()).dtype)
        bound = bandwidth_bound_s(weight_bytes(model), kv_token, row["floor_rows"] * context, 1, args.hbm_bytes_per_s)
        row.update(floor_bandwidth_bound_ms=1e3 * bound, floor_vs_bound=row["floor_step_ms"] / (1e3 * bound))
    log(f"floor batch {batch}: {row['floor_step_ms']:.2f} ms/step, {row['floor_tokens_per_s']:,.0f} tok/s, "
        f"{row.get('kernels_per_decode_step', row.get('aten_ops_per_decode_step'))} kernels (ops) per step "
        f"({row['kernels_counted_on']}), forward {row['floor_forward']}")
    row["engine_vs_floor"] = row["engine_tokens_per_s"] / row["floor_tokens_per_s"]
    log(f"batch {batch} (off: {','.join(args.off) or 'none'}): engine {row['engine_tokens_per_s']:,.0f} tok/s, "
        f"{row['engine_vs_own_mix_floor'] or 0:.0%} of its own-mix floor, step kinds "
        f"{ {k: v['steps'] for k, v in row['step_kinds'].items()} }, TTFT p50/p99 {row['ttft_p50_s']}/"
        f"{row['ttft_p99_s']} s, bandwidth bound {row.get('bandwidth_bound_s')} s")
    return row


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    pin_threads(1)
    compute = compute_thread(args.threads, "bench")
    model = on(compute, build_model, args.model, device)
    reqs = workload(args, model.config.vocab_size)
    log(f"{args.model} on {device}: {len(reqs)} requests, {sum(r.params.max_tokens for r in reqs)} tokens, longest "
        f"{max(r.params.max_tokens for r in reqs)}, mean context {mean_context(reqs)}")
    meta = dict(torch=torch.__version__, python=platform.python_version(), cpus=os.cpu_count(),
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
                date=datetime.date.today().isoformat(), args=vars(args), note=None if device.type == "cuda" else
                "CPU mode: a small model on a shared, busy 2-core machine; read the ratios, not the numbers")
    rows: list[dict[str, Any]] = []
    hf: dict[str, Any] = {}
    if not args.skip_hf:
        hf = on(compute, run_hf, model, reqs[: args.hf_requests], args.hf_cap, args.hf_time_s, device)
        log(f"HF generate: {hf['hf_tokens_per_s']:,.0f} tok/s ({hf['hf_steps']} steps in {hf['hf_seconds']:.1f} s)")
        write(Path(args.out), meta, rows, hf)
    for batch in [int(b) for b in args.batches.split(",")]:
        row = one_batch(model, reqs, batch, device, args, compute)
        row["engine_vs_hf"] = row["engine_tokens_per_s"] / hf["hf_tokens_per_s"] if hf else None
        rows.append(row)
        write(Path(args.out), meta, rows, hf)  # after every batch: a run cut short keeps what it measured
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    compute.shutdown()
    log(f"wrote {args.out}")


def write(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]], hf: dict[str, Any]) -> None:
    meta = dict(meta, total_s=time.perf_counter() - START, load_average_1min=os.getloadavg()[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, hf=hf, rows=rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
