"""Benchmark: trainer forward+backward tokens/s through the real actor path, one configuration
at a time, each printed and appended to the results file as it finishes.

`Actor.train_step` (one mini-batch, so old log-probs come from the update's own forward: one
forward and one backward per micro-batch, then one AdamW step) on a batch of random rows:
prompts of `--prompt-len` tokens (uniform), responses lognormal (`--median`, `--sigma`), each row
capped at `--max-row` tokens. The actor is built by the run's own factory
(`workers.factory.build_trainer_side`) from a `Config` of the device's defaults plus each
configuration's overrides, so whatever a run would resolve (the micro-batch budget, the attention
path, precision, compilation) the bench runs too, and reports what it resolved.

Configurations (`SETUPS`, in this order): the defaults first (`packed`: packed rows, the
attention path `auto` picks, the device's micro-batch budget), which run whatever the time
budget; then the A/B ones (`grouped` at CALL_COST 8192, `budget8192`, `autocast` (float32
parameters under autocast instead of bf16 ones over float32 masters; bf16 only), `compiled` or
`eager` (`actor.use_torch_compile`: whichever the device's defaults are not; the other is recorded
as skipped), `packed+ckpt`, `padded`), each only if the time the longest configuration so far
took, less its compile (paid once per process: later configurations reuse the compiled layers),
still fits in `--time-budget-s`, else recorded as skipped; a configuration whose key this tree
does not have is recorded as skipped with the config error; one that raises (a dynamo error, out of
memory) is recorded as failed with its error, and the next one runs. Each configuration builds its own model, takes one
warm-up step (the packed-attention path it ran read from `packed_attention.PATHS`), then
`--steps` timed steps, and frees the model before the next.

Per configuration: tokens/s (real prompt + response tokens per step over the median step), MFU
by verl's formula (`telemetry.perf.training_flops`) and over the FLOPs executed
(`telemetry.perf.executed_training_flops`: no embedding term, the head on response tokens only),
each over the GPU's bf16 peak (none on a CPU: TFLOP/s executed instead), peak memory
(CUDA's allocator; on a CPU the process's peak RSS), and the step split into backward (every
`Tensor.backward`), optimizer (every `optimizer.step`) and forward (the rest of the step: the
model's forward, log-probs, losses, host work), from CUDA events (CPU: perf_counter); with
compiled layers, the warm-up's compile seconds (`compile_s`, apart from the timed steps) and what
the timed steps compiled (`recompiles`, `timed_compile_s`: none once warm).

    PYTHONPATH=. python bench/trainer_throughput.py --device cuda   # Qwen2-0.5B shape, bf16
    PYTHONPATH=. python bench/trainer_throughput.py --device cpu    # a tiny model, float32

cuda: transformers' Qwen2Config of Qwen2-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings), random weights, bf16; appends to
bench/results/trainer_throughput.jsonl. cpu: the project's tiny-model size (hidden 128, 4 layers),
float32, 2 threads; appends to bench/results/trainer_throughput_cpu.jsonl. Each run appends a
`{"meta": ...}` line, then one line per configuration. It measures speed only; correctness lives
in tests/training.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from asyncrl.algorithms import compute_advantage
from asyncrl.config import Config, load_config
from asyncrl.errors import ConfigError
from asyncrl.pipelines.setup import trainer_device
from asyncrl.scheduling.plan import plan_run, torch_compile
from asyncrl.telemetry.perf import ModelShape, executed_training_flops, peak_flops, training_flops
from asyncrl.training import packed_attention
from asyncrl.training.actor import Actor
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.compile import CompileWatch, is_compiled
from asyncrl.types import Group, PromptRow, Trajectory
from asyncrl.workers.factory import build_trainer_side
from asyncrl.workers.trainer import PPOTrainer
from bench.engine import ForeignLoad

GB = 1024**3
DEVICES = ("cpu", "cuda")
MODELS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=32768),
    # the size of the project's built-in tiny model, Qwen2-shaped like the GPU one
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, vocab_size=128, tie_word_embeddings=True),
}


@dataclass(frozen=True)
class Setup:
    """One configuration: config overrides on top of the device's defaults."""

    name: str
    overrides: tuple[str, ...]
    about: str
    default: bool = False
    """Runs whatever the time budget (the configurations a run gets without overrides)."""
    call_cost: int | None = None
    """The grouped path's call cost in token pairs for this configuration (`pinned_call_cost`)."""
    default_on: tuple[str, ...] = ()
    """The devices whose defaults already are this configuration: skipped there."""


SETUPS = (
    Setup("packed", (), "the defaults: packed rows, auto attention, the device's micro-batch budget", default=True),
    Setup("grouped", ("model.packed_attention=grouped",), "today's fallback: sdpa over row groups, CALL_COST 8192",
          call_cost=8192),
    Setup("budget8192", ("actor.ppo_micro_batch_tokens=8192",), "the CPU-sized budget of 8192 tokens"),
    Setup("autocast", ("model.mixed_precision=autocast",), "float32 parameters under torch.autocast (bf16 runs)"),
    Setup("compiled", ("actor.use_torch_compile=true",), "decoder layers through torch.compile",
          default_on=tuple(d for d in DEVICES if torch_compile(None, d))),
    Setup("eager", ("actor.use_torch_compile=false",), "decoder layers eager",
          default_on=tuple(d for d in DEVICES if not torch_compile(None, d))),
    Setup("packed+ckpt", ("model.enable_gradient_checkpointing=true",), "activation checkpointing"),
    Setup("padded", ("model.use_remove_padding=false",), "padded micro-batches, no packing"),
)

DEFAULTS = {  # per device: model, dtype, workload
    "cuda": dict(model="qwen2-0.5b", dtype="bfloat16", rows=64, prompt_len="64,256", median=384.0, sigma=0.8,
                 max_row=2048, steps=4, out="bench/results/trainer_throughput.jsonl"),
    "cpu": dict(model="tiny", dtype="float32", rows=32, prompt_len="16,48", median=64.0, sigma=1.0,
                max_row=512, steps=4, out="bench/results/trainer_throughput_cpu.jsonl"),
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


def run_config(args: argparse.Namespace, setup: Setup) -> Config:
    """The device's defaults, `--budget` if given, then the setup's overrides (ConfigError when
    this tree lacks one of its keys)."""
    base = [f"trainer.device={args.device}", f"model.dtype={args.dtype}", f"data.max_response_length={args.max_row}",
            "actor.lr=1e-6", "actor.warmup_steps=0"]
    budget = [f"actor.ppo_micro_batch_tokens={args.budget}"] if args.budget else []
    return load_config(overrides=[*base, *budget, *setup.overrides])


def make_actor(args: argparse.Namespace, cfg: Config) -> tuple[Actor, dict[str, Any]]:
    """The actor a run of `cfg` trains, around a fresh random model built on the device (0.5B
    weights initialised on the host would take minutes), and the run's plan."""
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(Qwen2Config(**MODELS[args.model]))
    plan = plan_run(cfg, None, trainer_device(cfg, model.config))  # a run's budget: this GPU's memory, this model
    pad = cast(PreTrainedTokenizerBase, SimpleNamespace(pad_token_id=0))  # all the trainer side reads
    side = build_trainer_side(cfg, plan, model=model, tok=pad)
    assert isinstance(side, PPOTrainer)
    return side.actor, plan.to_dict()


class Clock:
    """Marks on the device's timeline: CUDA events (read after a synchronize), else perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@contextlib.contextmanager
def split_step(actor: Actor, clock: Clock) -> Iterator[dict[str, float]]:
    """Times what runs inside: the whole, every `Tensor.backward` and every optimizer step (the
    dict is filled on exit: step_s, forward_s = the rest, backward_s, optimizer_s)."""
    spans: dict[str, list[tuple[Any, Any]]] = {"backward": [], "optimizer": []}
    original = torch.Tensor.backward
    opened: list[Any] = []

    def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        start = clock.mark()
        original(tensor, *args, **kwargs)
        spans["backward"].append((start, clock.mark()))

    optimizer = actor.optimizer
    hooks = [optimizer.register_step_pre_hook(lambda *_: opened.append(clock.mark())),
             optimizer.register_step_post_hook(lambda *_: spans["optimizer"].append((opened.pop(), clock.mark())))]
    out: dict[str, float] = {}
    torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]
    try:
        clock.sync()
        start = clock.mark()
        yield out
        end = clock.mark()
        clock.sync()
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]
        for hook in hooks:
            hook.remove()
    out["step_s"] = clock.seconds(start, end)
    for name, pairs in spans.items():
        out[f"{name}_s"] = sum(clock.seconds(a, b) for a, b in pairs)
    out["forward_s"] = out["step_s"] - out["backward_s"] - out["optimizer_s"]


def attention_path(counts: Counter[str]) -> str:
    """The packed-attention path(s) a step ran (`packed_attention.PATHS`: varlen, jagged, grouped,
    masked); none for padded rows, which transformers' sdpa runs."""
    return "+".join(sorted(counts)) or "none (padded: sdpa)"


def measure(args: argparse.Namespace, cfg: Config, batch: TrainBatch) -> dict[str, Any]:
    """Build, warm up and time one configuration; its result row."""
    device = torch.device(args.device)
    clock = Clock(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start, compiling = time.perf_counter(), CompileWatch()
    actor, plan = make_actor(args, cfg)
    before = Counter(packed_attention.PATHS)
    actor.train_step(batch, num_mini_batches=1)  # the warm-up: kernels, allocator, optimizer state, compilation
    paths = packed_attention.PATHS - before
    clock.sync()
    warmup_s, warmup_compile = time.perf_counter() - start, compiling.report()
    steps = []
    for _ in range(args.steps):
        with ForeignLoad() as load, split_step(actor, clock) as split:
            cpu = time.process_time()
            actor.train_step(batch, num_mini_batches=1)
        steps.append(split | {"cpu_s": time.process_time() - cpu, "foreign_cores": load.cores})
    row = dict(warmup_s=warmup_s, micro_batch_tokens=actor.cfg.ppo_micro_batch_tokens, plan=plan,
               attention_calls=dict(paths), attention_path=attention_path(paths), head=actor.head.describe(),
               precision=actor.precision.describe(), compiled=is_compiled(actor.model),
               compile_s=warmup_compile["perf/compile_s"], **timed_compiles(compiling.report()),
               **rates(actor, cfg, batch, steps), **peak_memory(device))
    del actor
    free_device_memory(device)
    return row


def free_device_memory(device: torch.device) -> None:
    """What the last configuration held goes back before the next one builds its model."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed_compiles(report: dict[str, float]) -> dict[str, float]:
    """What the timed steps compiled (none once warm): recompiles and their seconds, inside the
    steps' times, where the warm-up's compile (`compile_s`) is not."""
    return {"recompiles": report["perf/recompiles"], "timed_compile_s": report["perf/compile_s"]}


def rates(actor: Actor, cfg: Config, batch: TrainBatch, steps: list[dict[str, float]]) -> dict[str, Any]:
    """Median step, its split, tokens/s, TFLOP/s executed and both MFUs (None off a known GPU)."""
    median = statistics.median(s["step_s"] for s in steps)
    lengths = [int(n) for n in batch.attention_mask.sum(-1).tolist()]
    responses = [int(n) for n in batch.response_mask.sum(-1).tolist()]
    shape = ModelShape.from_hf(actor.model.config)
    assert shape is not None
    verl = training_flops(shape, lengths)
    executed = executed_training_flops(shape, lengths, responses, recompute=cfg.model.enable_gradient_checkpointing)
    device = batch.responses.device
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    split = {f"{k}_median": statistics.median(s[k] for s in steps)
             for k in ("forward_s", "backward_s", "optimizer_s", "cpu_s")}
    return dict(steps=len(steps), real_tokens=sum(lengths), response_tokens=sum(responses), step_s_median=median,
                step_s_all=[s["step_s"] for s in steps], tokens_per_s=sum(lengths) / median,
                tflops_executed=executed / median / 1e12, mfu_verl=verl / median / peak if peak else None,
                mfu_executed=executed / median / peak if peak else None,
                foreign_cores_max=max(s["foreign_cores"] for s in steps), **split)


def peak_memory(device: torch.device) -> dict[str, float]:
    """CUDA's peak allocation since this configuration started; on a CPU the process's peak RSS."""
    if device.type == "cuda":
        return {"peak_memory_gb": torch.cuda.max_memory_allocated(device) / GB}
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB}


@contextlib.contextmanager
def pinned_call_cost(setup: Setup) -> Iterator[None]:
    """The grouped path's call cost (`packed_attention.call_cost`, device-aware) pinned for the
    configurations that name one: 8192 token pairs, the CPU's, is what GPUs ran before it was."""
    saved = packed_attention.call_cost
    if setup.call_cost is not None:
        pinned = float(setup.call_cost)
        packed_attention.call_cost = lambda *_: pinned
    try:
        yield
    finally:
        packed_attention.call_cost = saved


def append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def line(row: dict[str, Any]) -> str:
    """One printed line per configuration."""
    if row["status"] != "ran":
        return f"{row['config']}: {row['status']} ({row['reason']})"
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    memory = row.get("peak_memory_gb", row.get("peak_rss_gb"))
    return (f"{row['config']}: {row['tokens_per_s']:,.0f} tok/s, step {row['step_s_median']:.3f} s "
            f"(fwd {row['forward_s_median']:.3f} bwd {row['backward_s_median']:.3f} "
            f"opt {row['optimizer_s_median']:.3f}), MFU verl {pct(row['mfu_verl'])} executed "
            f"{pct(row['mfu_executed'])}, {row['tflops_executed']:.2f} TFLOP/s, peak {memory:.2f} GiB, "
            f"budget {row['micro_batch_tokens']}, attention {row['attention_path']}, head {row['head']}, "
            f"precision {row['precision'].split(' ')[0]}, "
            f"{'compiled' if row['compiled'] else 'eager'} (compile {row['compile_s']:.1f} s, "
            f"{row['recompiles']:.0f} recompiles), warm-up {row['warmup_s']:.1f} s")


def chosen(names: str) -> list[Setup]:
    """The named setups (all when empty), the defaults first, then SETUPS' order."""
    wanted = names.split(",") if names else [s.name for s in SETUPS]
    unknown = set(wanted) - {s.name for s in SETUPS}
    assert not unknown, f"unknown configurations {sorted(unknown)}: choose from {[s.name for s in SETUPS]}"
    return sorted((s for s in SETUPS if s.name in wanted), key=lambda s: not s.default)


class SkipSetup(Exception):
    """A configuration not run: the time budget, or the same as the defaults on this device."""


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every chosen configuration in turn, each appended to `args.out` and printed as it ends."""
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    batch = train_batch(workload(args, int(MODELS[args.model]["vocab_size"]))).to(device)
    append(out, {"meta": meta(args, batch)})
    start, longest, rows = time.perf_counter(), 0.0, []
    for setup in chosen(args.configs):
        row: dict[str, Any] = dict(config=setup.name, about=setup.about, overrides=list(setup.overrides))
        left = args.time_budget_s - (time.perf_counter() - start)
        began = time.perf_counter()
        try:
            cfg = run_config(args, setup)
            if args.device in setup.default_on:
                raise SkipSetup(f"the defaults on {args.device} are this configuration")
            if not setup.default and longest > left:
                raise SkipSetup(f"time budget: ~{longest:.0f} s needed, {max(left, 0):.0f} s left")
            with pinned_call_cost(setup):
                row |= dict(status="ran", **measure(args, cfg, batch))
        except (ConfigError, SkipSetup) as e:
            row |= dict(status="skipped", reason=str(e).splitlines()[0])
        except Exception as e:  # a failing configuration (a dynamo error, an OOM) is a result; the next one runs
            row |= dict(status="failed", reason=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:500])
            free_device_memory(torch.device(args.device))
        # a compile is paid once per process: later configurations reuse the compiled layers
        longest = max(longest, time.perf_counter() - began - row.get("compile_s", 0.0))
        append(out, row)
        print(line(row), flush=True)
        rows.append(row)
    return rows


def meta(args: argparse.Namespace, batch: TrainBatch) -> dict[str, Any]:
    lengths = batch.attention_mask.sum(-1).tolist()
    return dict(torch=torch.__version__, python=platform.python_version(), cpus=os.cpu_count(),
                device=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
                started=time.strftime("%Y-%m-%dT%H:%M:%S"), args=vars(args),
                workload=dict(rows=batch.size, real_tokens=int(sum(lengths)), padded_tokens=batch.input_ids.numel(),
                              row_tokens_median=statistics.median(lengths), row_tokens_max=max(lengths)),
                command="PYTHONPATH=. python bench/trainer_throughput.py " + " ".join(sys.argv[1:]))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", choices=list(MODELS))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int)
    ap.add_argument("--prompt-len", help="low,high prompt tokens (uniform)")
    ap.add_argument("--median", type=float, help="median response tokens (lognormal)")
    ap.add_argument("--sigma", type=float)
    ap.add_argument("--max-row", type=int, help="longest row, prompt + response")
    ap.add_argument("--budget", type=int, default=0,
                    help="actor.ppo_micro_batch_tokens for every configuration (default: the config's, per device)")
    ap.add_argument("--steps", type=int, help="timed steps per configuration")
    ap.add_argument("--configs", default="", help=f"comma list of {','.join(s.name for s in SETUPS)} (default: all)")
    ap.add_argument("--time-budget-s", type=float, default=60.0,
                    help="A/B configurations start only while the longest so far still fits (defaults always run)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON lines, appended")
    args = ap.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse()
    start = time.perf_counter()
    run(args)
    print(f"appended to {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
