"""Benchmark: trainer forward+backward tokens/s through the real actor path.

`Actor.train_step` (one mini-batch, so old log-probs come from the update's own forward: one
forward and one backward per micro-batch, then one AdamW step on float32 masters) on a batch of
random rows: prompts of `--prompt-len` tokens (uniform), responses lognormal (`--median`,
`--sigma`), each row capped at `--max-row` tokens. Micro-batches hold `--budget` tokens.
Tokens/s counts real tokens (prompt + response) per step; padded configurations compute more.

Configurations (`--configs`): packed (`use_remove_padding=True`), packed + activation
checkpointing, padded (the same rows, left/right-padded micro-batches), padded + checkpointing.
Steps alternate between configurations (`--steps` timed rounds after one warm-up round), so a
slow spell of a shared machine hits them alike; the median, min and max of each are reported,
with the CPU cores other processes used during each step (`ForeignLoad`). On the CPU the
process's CPU time per step is reported too: on a shared machine wall-clock waits for cores,
CPU time much less so (tokens per CPU-second compares configurations there).

    PYTHONPATH=. python bench/trainer_throughput.py --device cuda   # Qwen2-0.5B shape, bf16
    PYTHONPATH=. python bench/trainer_throughput.py --device cpu    # a tiny model, float32

cuda: transformers' Qwen2Config of Qwen2-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings), random weights, bf16 autocast over float32
masters; writes bench/results/trainer_throughput.json. cpu: the project's tiny-model size (hidden
128, 4 layers), float32, 2 threads; writes bench/results/trainer_throughput_cpu.json.
It measures speed only; correctness lives in tests/training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.algorithms import compute_advantage
from asyncrl.config.schema import ActorConfig
from asyncrl.telemetry.perf import ModelShape, actor_mfu
from asyncrl.training.actor import Actor
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.memory import enable_gradient_checkpointing
from asyncrl.types import Group, PromptRow, Trajectory
from bench.engine import ForeignLoad

MODELS: dict[str, dict[str, int | bool]] = {
    "qwen2-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=32768),
    # the size of the project's built-in tiny model, Qwen2-shaped like the GPU one
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, vocab_size=128, tie_word_embeddings=True),
}
CONFIGS = {"packed": (True, False), "packed+ckpt": (True, True), "padded": (False, False),
           "padded+ckpt": (False, True)}
"""name -> (use_remove_padding, activation checkpointing)."""

DEFAULTS = {  # per device: model, dtype, workload
    "cuda": dict(model="qwen2-0.5b", dtype="bfloat16", rows=64, prompt_len="64,256", median=384.0, sigma=0.8,
                 max_row=2048, budget=2048, steps=4, configs="packed,packed+ckpt,padded",
                 out="bench/results/trainer_throughput.json"),
    "cpu": dict(model="tiny", dtype="float32", rows=32, prompt_len="16,48", median=64.0, sigma=1.0,
                max_row=512, budget=2048, steps=4, configs="packed,packed+ckpt,padded",
                out="bench/results/trainer_throughput_cpu.json"),
}


def workload(args: argparse.Namespace, vocab: int) -> list[Group]:
    """`args.rows` rows, one per group: random tokens, lognormal response lengths."""
    g = torch.Generator().manual_seed(args.seed)
    low, high = (int(x) for x in args.prompt_len.split(","))
    groups = []
    for i in range(args.rows):
        prompt_len = int(torch.randint(low, high + 1, (1,), generator=g))
        drawn = math.exp(math.log(args.median) + args.sigma * float(torch.randn(1, generator=g)))
        length = max(1, min(round(drawn), args.max_row - prompt_len))
        prompt = torch.randint(1, vocab, (prompt_len,), generator=g).tolist()
        response = torch.randint(1, vocab, (length,), generator=g).tolist()
        traj = Trajectory(request_id=f"r{i}", prompt_ids=prompt, response_ids=response, logprobs=[0.0] * length,
                          versions=[0] * length, finish_reason="stop", reward=float(i % 2))
        row = PromptRow(uid=f"g{i // 2}", data_source="bench", messages=(), ground_truth="", prompt_ids=tuple(prompt))
        groups.append(Group(uid=f"g{i // 2}", row=row, trajectories=[traj]))
    return groups


def train_batch(groups: list[Group]) -> TrainBatch:
    batch = build_batch(groups, pad_id=0)
    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    return batch


def make_actor(args: argparse.Namespace, device: torch.device, pack: bool, checkpointing: bool) -> Actor:
    torch.manual_seed(0)
    with device:  # built on the device: initialising 0.5B weights on the host would take minutes
        model = Qwen2ForCausalLM(Qwen2Config(**MODELS[args.model]))
    if checkpointing:
        enable_gradient_checkpointing(model)
    cfg = ActorConfig(ppo_micro_batch_tokens=args.budget, lr=1e-6, warmup_steps=0)
    return Actor(model, cfg, temperature=1.0, norm_length=args.max_row, compute_dtype=getattr(torch, args.dtype),
                 use_remove_padding=pack)


def timed_step(actor: Actor, batch: TrainBatch, device: torch.device) -> tuple[float, float, float]:
    """(wall seconds, process CPU seconds, foreign CPU cores) of one train_step."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    with ForeignLoad() as load:
        start, cpu = time.perf_counter(), time.process_time()
        actor.train_step(batch, num_mini_batches=1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return seconds, cpu, load.cores


def summary(name: str, times: list[tuple[float, float, float]], batch: TrainBatch, actor: Actor) -> dict[str, object]:
    seconds, cpu = [t[0] for t in times], [t[1] for t in times]
    median = statistics.median(seconds)
    lengths = [int(n) for n in batch.attention_mask.sum(-1).tolist()]
    tokens, device = sum(lengths), batch.responses.device
    pack, ckpt = CONFIGS[name]
    row: dict[str, object] = dict(
        config=name, use_remove_padding=pack, checkpointing=ckpt, steps=len(times), real_tokens=tokens,
        step_s_median=median, step_s_min=min(seconds), step_s_max=max(seconds), step_s_all=seconds,
        tokens_per_s=tokens / median, tokens_per_s_best=tokens / min(seconds),
        tokens_per_s_worst=tokens / max(seconds), foreign_cores_max=max(t[2] for t in times))
    if device.type == "cpu":
        row |= dict(cpu_s_median=statistics.median(cpu), cpu_s_min=min(cpu), cpu_s_max=max(cpu), cpu_s_all=cpu,
                    tokens_per_cpu_s=tokens / statistics.median(cpu))
    else:  # verl's MFU: model FLOPs of the real tokens over the GPU's bf16 peak
        mfu = actor_mfu(ModelShape.from_hf(actor.model.config), lengths, median, 1, torch.cuda.get_device_name(device))
        row["mfu"] = mfu.get("perf/mfu/actor")
    print(json.dumps(row), flush=True)
    return row


def run(args: argparse.Namespace) -> dict[str, object]:
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    names = args.configs.split(",")
    actors = {name: make_actor(args, device, *CONFIGS[name]) for name in names}
    vocab = int(MODELS[args.model]["vocab_size"])
    batch = train_batch(workload(args, vocab))
    tokens = int(batch.attention_mask.sum())
    batch = batch.to(device)
    for actor in actors.values():  # warm-up: kernels, allocator, optimizer state
        actor.train_step(batch, num_mini_batches=1)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(args.steps):
        for name, actor in actors.items():
            times[name].append(timed_step(actor, batch, device))
    rows = [summary(name, times[name], batch, actors[name]) for name in names]
    lengths = batch.attention_mask.sum(-1).tolist()
    memory = {} if device.type != "cuda" else dict(max_memory_allocated_gb=torch.cuda.max_memory_allocated() / 1024**3)
    return dict(rows=rows, workload=dict(rows=batch.size, real_tokens=tokens, padded_tokens=batch.input_ids.numel(),
                                         row_tokens_median=statistics.median(lengths), row_tokens_max=max(lengths)),
                **memory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", choices=list(MODELS))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int)
    ap.add_argument("--prompt-len", help="low,high prompt tokens (uniform)")
    ap.add_argument("--median", type=float, help="median response tokens (lognormal)")
    ap.add_argument("--sigma", type=float)
    ap.add_argument("--max-row", type=int, help="longest row, prompt + response")
    ap.add_argument("--budget", type=int, help="tokens per micro-batch (actor.ppo_micro_batch_tokens)")
    ap.add_argument("--steps", type=int, help="timed steps per configuration")
    ap.add_argument("--configs", help=f"comma list of {','.join(CONFIGS)}")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    start = time.perf_counter()
    result = run(args)
    meta = dict(torch=torch.__version__, python=platform.python_version(), cpus=os.cpu_count(),
                device=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
                wall_s=time.perf_counter() - start, args=vars(args),
                command="PYTHONPATH=. python bench/trainer_throughput.py " + " ".join(sys.argv[1:]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, **result), indent=2) + "\n")
    print(f"wrote {out} in {meta['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
