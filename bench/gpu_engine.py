"""Benchmark: TorchEngine tokens/s on one GPU, against its own CUDA-graph floor and HF `generate`.

Workload (issue 13): a Qwen2-0.5B-shaped model (transformers Qwen2Config: hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings; random weights, bf16),
256 requests, prompts of 64..256 random tokens, response lengths lognormal (median 256, sigma
1.0, seed 0) capped at 2048, EOS ignored (`SamplingParams(ignore_eos=True)`, so each response
is exactly its drawn `max_tokens`), temperature 1, no top-k/p.

Per max batch (`--batches`, 64 and 256):
- floor: one `BatchedForward.decode` step of that many rows over a static KV cache, every row at
  the workload's mean context length (token-weighted: the mean context a generated token sees),
  captured in a CUDA graph and replayed; tokens/s = batch / step time. No sampling, no prefill,
  no scheduling, no long tail: the most a decode-only engine could do at a full batch.
- engine: `TorchEngine` (CUDA graphs, KV cache sized by `gpu_memory_utilization`) on every
  request at once: generated tokens / wall time. The first run on an engine captures its graphs
  (once per (bucket, attention length) key, timed); the headline, `engine_tokens_per_s`, is the
  steady state: the last run's tokens / (its wall time - the capture time spent in it). With
  `--engine-runs 2` the second run replays only, which checks that subtraction.
- HF generate: `--hf-requests` requests in one left-padded batch, lengths capped at `--hf-cap`,
  `min_new_tokens = max_new_tokens` (EOS ignored), stopped after `--hf-time-s` seconds
  (`max_time`); useful tokens (each row's requested tokens reached) / wall time.

Targets (the issue's): engine >= 80% of the floor, >= 20x HF generate.

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
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's asyncrl, without PYTHONPATH

from asyncrl.compute import compute_thread, pin_threads  # noqa: E402
from asyncrl.rollout import EngineSettings, TorchEngine, run_sync  # noqa: E402
from asyncrl.rollout.forward import BatchedForward  # noqa: E402
from asyncrl.types import GenerationRequest, SamplingParams  # noqa: E402
from bench.engine import left_padded  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "qwen2-small": dict(vocab_size=4096, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=384, tie_word_embeddings=True),
}
CUDA_DEFAULTS = dict(model="qwen2-0.5b", num_requests=256, prompt_min=64, prompt_max=256, median=256.0,
                     cap=2048, batches="64,256", hf_requests=64, hf_cap=512, hf_time_s=30.0, engine_runs=1,
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


def floor(model: Qwen2ForCausalLM, batch: int, context: int, device: torch.device, iters: int) -> dict[str, float]:
    """Decode steps of `batch` rows at position `context - 1` over a static cache, replayed from
    one CUDA graph (eager on the CPU): batch / step time."""
    forward = BatchedForward(model)
    cache = forward.new_cache(batch, device)
    cache.static = True
    cache.allocate(context)
    tokens = torch.randint(1, forward.vocab_size, (batch,), device=device)
    positions = torch.full((batch,), context - 1, dtype=torch.int64, device=device)
    out = torch.empty(batch, forward.vocab_size, dtype=torch.float32, device=device)

    def step() -> None:
        forward.decode(cache, tokens, positions, length=context, out=out)

    with torch.inference_mode():
        step()  # warm-up (lazy kernels, cuBLAS handles)
        if device.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            step = graph.replay
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            step()
        synchronize(device)
        seconds = (time.perf_counter() - start) / iters
    return dict(floor_step_ms=seconds * 1e3, floor_tokens_per_s=batch / seconds)


def run_engine(model: Qwen2ForCausalLM, reqs: list[GenerationRequest], batch: int, device: torch.device,
               runs: int, compute: Executor) -> dict[str, Any]:
    """Every request at once, `runs` times on one engine; the first run captures the graphs."""
    max_model_len = max(len(r.prompt_ids) + r.params.max_tokens for r in reqs)
    settings = EngineSettings(max_num_seqs=batch, kv_budget_tokens=max_model_len * batch, max_model_len=max_model_len,
                              device=str(device), seed=0, static_decode=True)
    engine = TorchEngine(model, 0, settings, executor=compute)
    graphs = engine._runner.graphs
    assert graphs is not None, "the static path needs the fast forward"
    useful = sum(r.params.max_tokens for r in reqs)
    walls, steady = [], []
    for run in range(runs):
        steps_before, capture_before = sum(graphs.steps.values()), graphs.capture_s
        t0 = time.perf_counter()
        outs = run_sync(engine, reqs)
        walls.append(time.perf_counter() - t0)
        steady.append(walls[-1] - (graphs.capture_s - capture_before))
        assert [len(o.response_ids) for o in outs] == [r.params.max_tokens for r in reqs]
        decode_steps = sum(graphs.steps.values()) - steps_before
        log(f"  engine batch {batch} run {run}: {walls[-1]:.1f} s ({steady[-1]:.1f} s without captures), "
            f"{useful / steady[-1]:,.0f} tok/s, {decode_steps} decode steps, {graphs.captures} graphs "
            f"captured in {graphs.capture_s:.1f} s")
    kv = engine._runner.kv_plan
    row = dict(engine_tokens_per_s=useful / steady[-1], engine_seconds=steady[-1],
               engine_first_run_tokens_per_s=useful / walls[0], engine_first_run_seconds=walls[0],
               captures=graphs.captures, capture_s=graphs.capture_s, decode_steps=decode_steps,
               mean_decode_rows=useful / max(decode_steps, 1), kv_slots=engine._runner.max_num_seqs,
               kv_cache_gib=None if kv is None else kv.kv_bytes / 2**30, max_model_len=max_model_len)
    engine.close()
    return row


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


def main() -> None:
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
    ap.add_argument("--out")
    args = ap.parse_args()
    defaults = CUDA_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu")
    device = torch.device(args.device)
    pin_threads(1)
    compute = compute_thread(args.threads, "bench")
    model = on(compute, build_model, args.model, device)
    reqs = workload(args, model.config.vocab_size)
    context = mean_context(reqs)
    useful = sum(r.params.max_tokens for r in reqs)
    log(f"{args.model} on {device}: {len(reqs)} requests, {useful} tokens, longest "
        f"{max(r.params.max_tokens for r in reqs)}, mean context {context}")
    meta = dict(torch=torch.__version__, python=platform.python_version(), cpus=os.cpu_count(),
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
                date=datetime.date.today().isoformat(), args=vars(args), note=None if device.type == "cuda" else
                "CPU mode: a small model on a shared, busy 2-core machine; read the ratios, not the numbers")
    rows: list[dict[str, Any]] = []
    hf = on(compute, run_hf, model, reqs[: args.hf_requests], args.hf_cap, args.hf_time_s, device)
    log(f"HF generate: {hf['hf_tokens_per_s']:,.0f} tok/s ({hf['hf_steps']} steps in {hf['hf_seconds']:.1f} s)")
    write(Path(args.out), meta, rows, hf)
    for batch in [int(b) for b in args.batches.split(",")]:
        row: dict[str, Any] = dict(batch=batch, mean_context=context, useful_tokens=useful)
        row.update(on(compute, floor, model, batch, context, device, args.floor_iters))
        log(f"floor batch {batch}: {row['floor_step_ms']:.2f} ms/step, {row['floor_tokens_per_s']:,.0f} tok/s")
        row.update(run_engine(model, reqs, batch, device, args.engine_runs, compute))
        row["engine_vs_floor"] = row["engine_tokens_per_s"] / row["floor_tokens_per_s"]
        row["engine_vs_hf"] = row["engine_tokens_per_s"] / hf["hf_tokens_per_s"]
        row["targets_met"] = dict(floor_80pct=row["engine_vs_floor"] >= 0.8, hf_20x=row["engine_vs_hf"] >= 20)
        rows.append(row)
        log(f"batch {batch}: engine {row['engine_tokens_per_s']:,.0f} tok/s = {row['engine_vs_floor']:.0%} of "
            f"the floor, {row['engine_vs_hf']:.1f}x HF")
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
