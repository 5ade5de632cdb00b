"""Pipelines side by side on a long-tail workload: colocated (2 cores, 1 core, with tail
batching) vs one-step-off vs fully async (a-d). The two plain colocated runs are what
bench/sim_vs_measured.py fits the simulator's CPU profile to; it predicts the others.

Workload: the built-in `longtail` task with `rollout.length_from_prompt=true`, so every response
decodes exactly the length its prompt asks for (lognormal, median ~50, capped at
`--max-len`), EOS ignored: a real length tail independent of what the tiny model has learned.
Every configuration trains the same number of samples with the same model. Each run is a
separate `asyncrl train` process; wall-clock is the sum of `timing_s/step` (start-up and
model loading excluded), samples/s = trained responses / that time.

    PYTHONPATH=. python bench/pipelines.py            # writes bench/results/pipelines.json
                                                      # and the table in docs/benchmarks.md
The scores are not a learning result: the tiny model was never taught this task.

`--gpu`: the same comparison on one GPU (`trainer.device=cuda`, `model.dtype=bfloat16`) with a
Qwen2-0.5B-shaped body (24 layers, hidden 896, q/k/v biases, random weights, the tiny model's
tokenizer and vocabulary, saved once under --runs-dir; a Llama config, since transformers
replaces a character tokenizer saved beside a qwen2 one): colocated in one process, one-step-off and fully async
as two processes sharing the GPU (`backend=processes`, weights by CUDA IPC). Writes
bench/results/pipelines_gpu.json; `bench/sim_vs_measured.py --gpu` predicts the decoupled runs
from the colocated one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECOUPLED = ["rollout.num_cpus=1", "trainer.num_cpus=1"]
CONFIGS: dict[str, list[str]] = {
    "colocated": ["pipeline=colocated", "num_threads=2"],
    "colocated 1 core": ["pipeline=colocated", "num_threads=1"],
    "colocated + tail batching": ["pipeline=colocated", "num_threads=2", "tail_batching.enable=true"],
    "one_step_off": ["pipeline=one_step_off", *DECOUPLED],
    "fully_async (a) on-policy": ["pipeline=fully_async", *DECOUPLED],
    "fully_async (b) T=2": ["pipeline=fully_async", "async_training.trigger_parameter_sync_step=2", *DECOUPLED],
    "fully_async (c) stale 0.5": ["pipeline=fully_async", "async_training.staleness_threshold=0.5", *DECOUPLED],
    "fully_async (d) partial 0.5": ["pipeline=fully_async", "async_training.staleness_threshold=0.5",
                                    "async_training.partial_rollout=true", *DECOUPLED],
}


ON_GPU = ["trainer.device=cuda", "model.dtype=bfloat16", "rollout.max_num_seqs=256", "rollout.kv_budget_tokens=1048576"]
GPU_CONFIGS: dict[str, list[str]] = {
    "colocated": ["pipeline=colocated", "backend=local"],
    "one_step_off": ["pipeline=one_step_off", "backend=processes"],
    "fully_async (c) stale 0.5": ["pipeline=fully_async", "backend=processes",
                                  "async_training.staleness_threshold=0.5"],
    "fully_async (d) partial 0.5": ["pipeline=fully_async", "backend=processes",
                                    "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true"],
}
QWEN_BODY = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, tie_word_embeddings=True, attention_bias=True, rope_theta=1e6)


def qwen_body(root: Path) -> Path:
    """A Qwen2-0.5B-shaped model over the tiny model's tokenizer (random weights), saved once."""
    path = root / "qwen05b-body"
    if (path / "config.json").exists():
        return path
    from transformers import LlamaConfig, LlamaForCausalLM

    from asyncrl.models.tiny import load_tiny

    _, tok = load_tiny(log=print)
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **QWEN_BODY)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def common(args: argparse.Namespace) -> list[str]:
    return ["data.task=longtail", "rollout.length_from_prompt=true", f"data.max_response_length={args.max_len}",
            f"data.train_batch_size={args.prompts}", f"actor.ppo_mini_batch_size={args.prompts // 2}",
            f"rollout.n={args.n}", f"trainer.total_training_steps={args.steps}", "trainer.test_freq=0",
            "trainer.val_before_train=false", "data.val_size=16", "trainer.logger=[jsonl]",
            f"actor.ppo_micro_batch_tokens={args.micro_tokens}"]


def run(name: str, overrides: list[str], out: Path) -> dict[str, float]:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "asyncrl.cli", "train", f"trainer.output_dir={out}", *overrides]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    wall = sum(r["timing_s/step"] for r in steps)
    trained = int(sum(r.get("training/responses", 0) for r in steps))
    return {"config": name, "wall_s": wall, "process_s": time.perf_counter() - start,
            "steps": len(steps), "trained_responses": trained, "samples_per_s": trained / wall,
            "trainer_idle_ratio": _mean(steps, "trainer/idle_ratio"),
            "rollouter_idle_ratio": _mean(steps, "rollouter/idle_ratio"),
            "wait_prev_gen_s": _mean(steps, "timing_s/wait_prev_gen"),
            "final_val_score": next((r["val/score/mean"] for r in reversed(rows) if "val/score/mean" in r), 0.0)}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def table(results: list[dict], args: argparse.Namespace) -> str:
    base = next(r for r in results if r["config"] == "colocated")["wall_s"]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| pipeline | wall s | speed-up | samples/s | trainer idle | rollouter idle | wait_prev_gen s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['config']} | {r['wall_s']:.1f} | {base / r['wall_s']:.2f}× | {r['samples_per_s']:.1f} | "
                     f"{fmt(r['trainer_idle_ratio'])} | {fmt(r['rollouter_idle_ratio'])} | "
                     f"{fmt(r['wait_prev_gen_s'])} |")
    cmd = "PYTHONPATH=. python bench/pipelines.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "runs_dir") and v != "")
    return "\n".join([f"Command: `{cmd}`", "", *lines])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--micro-tokens", type=int, default=8192)
    p.add_argument("--only", default="", help="comma-separated config names (default: all)")
    p.add_argument("--out", default="", help="default: bench/results/pipelines.json (--gpu: pipelines_gpu.json)")
    p.add_argument("--runs-dir", default="", help="keep each run's outputs here (default: a temp dir)")
    p.add_argument("--gpu", action="store_true", help="one GPU, a Qwen2-0.5B-shaped body (see above)")
    args = p.parse_args()
    args.out = args.out or str(ROOT / "bench" / "results" / ("pipelines_gpu.json" if args.gpu else "pipelines.json"))
    configs = GPU_CONFIGS if args.gpu else CONFIGS
    names = [n for n in configs if not args.only or n in args.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs_dir or tmp)
        device = [*ON_GPU, f"model.path={qwen_body(root)}"] if args.gpu else []
        for i, name in enumerate(names):
            overrides = [*common(args), *device, *configs[name]]
            shutil.rmtree(root / str(i), ignore_errors=True)  # a fresh run, not a resume
            out = root / str(i)
            results.append(run(name, overrides, out) | {"overrides": overrides, "run_dir": str(out)})
            print(json.dumps(results[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(table(results, args))


if __name__ == "__main__":
    main()
