"""Pipelines side by side on a long-tail workload: colocated (2 cores, 1 core, with tail
batching) vs one-step-off vs fully async (a-d). The two plain colocated runs are what
bench/sim_vs_measured.py fits the simulator's CPU profile to; it predicts the others.

Workload: the built-in `longtail` task with `rollout.length_from_prompt=true`, so every response
decodes exactly the length its prompt asks for (lognormal, median ~50, capped at
`--max-len`), EOS ignored: a real length tail independent of what the tiny model has learned.
Every configuration trains the same number of samples with the same model. Each run is a
separate `asyncrl train` process; wall-clock is the sum of `timing_s/step` (start-up and
model loading excluded), samples/s = trained responses / that time.

Each configuration runs in a directory of its own made for it (`--runs-dir`/<name>-XXXX, never
reused), with `trainer.resume_mode=disable`, as the leader of its own process group: when it
ends, times out (`--timeout-s`) or this bench is stopped, the whole group is killed, so no run
outlives its turn (on the first GPU run a stopped colocated run wrote its checkpoint into the next
configuration's directory, which then "resumed" at its last step and trained nothing). The results
file is rewritten after every configuration; a configuration that fails, times out or trains
nothing goes under "failed" with the tail of its stderr, and the next one runs.
`--merge` keeps what the results file (and `--steps-out`) already hold and adds to them, so that
separate invocations (the GPU session's colocated, then one_step_off) fill one file. `--steps-out`
writes each configuration's per-step `timing_s/*` and `perf/*` metrics (`update_actor`,
`old_log_prob`, MFU ...), from a stopped or failed run too: the steps it logged.
`actor.ppo_micro_batch_tokens` is passed only with `--micro-tokens N` (default: the device's
budget; `--micro-tokens 8192` reproduces the runs before it was derived); `--override KEY=VALUE`
adds a key to every configuration.

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
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STDERR_LINES = 30
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
QWEN_BODY: dict[str, Any] = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
                                 attention_bias=True, rope_theta=1e6)


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
    """Every configuration's keys. Resume is off: a configuration never continues a checkpoint,
    even one a stray process wrote into its directory."""
    budget = [f"actor.ppo_micro_batch_tokens={args.micro_tokens}"] if args.micro_tokens else []
    return ["data.task=longtail", "rollout.length_from_prompt=true", f"data.max_response_length={args.max_len}",
            f"data.train_batch_size={args.prompts}", f"actor.ppo_mini_batch_size={args.prompts // 2}",
            f"rollout.n={args.n}", f"trainer.total_training_steps={args.steps}", "trainer.test_freq=0",
            "trainer.val_before_train=false", "data.val_size=16", "trainer.logger=[jsonl]",
            "trainer.resume_mode=disable", *budget, *args.override]


def train_command(out: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "asyncrl.cli", "train", f"trainer.output_dir={out}", *overrides]


class RunFailed(Exception):
    """A configuration that did not train: its exit status or timeout, and its stderr's tail."""


def fresh_dir(root: Path, name: str) -> Path:
    """A new directory for one configuration's run, never used before (no earlier or stray run's
    checkpoint can be in it)."""
    slug = "".join(c if c.isalnum() else "_" for c in name)
    return Path(tempfile.mkdtemp(prefix=f"{slug}-", dir=root))


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid` (empty without /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # comm, in parentheses, may hold spaces
        except OSError:
            continue  # exited while we looked
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """Wait (a bounded while) until the SIGKILLed group's processes have died: the kill is
    delivered asynchronously, and the group leader's own exit says nothing of its children."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def launch(cmd: list[str], out: Path, timeout_s: float) -> None:
    """Run `cmd` in its own process group (stdout and stderr in `out`), and kill the whole group
    when it returns, times out or this process is stopped: no process of the run outlives it."""
    with (out / "stdout.log").open("w") as stdout, (out / "stderr.log").open("w") as stderr:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            wait_group_gone(proc.pid)
    if rc != 0:
        raise RunFailed(f"timed out after {timeout_s:.0f} s" if rc is None else f"exit status {rc}")


STEP_PREFIXES = ("timing_s/", "perf/")
"""The per-step metrics `--steps-out` keeps: where a step's time goes, and the trainer's MFU."""


def metric_rows(out: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl, one dict per line (a line cut short by a kill is left out)."""
    metrics = out / "metrics.jsonl"
    rows = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def step_metrics(out: Path) -> list[dict[str, Any]]:
    """Each logged training step's `timing_s/*` and `perf/*` values, with its step number."""
    return [{"step": r.get("step", i + 1), **{k: v for k, v in r.items() if k.startswith(STEP_PREFIXES)}}
            for i, r in enumerate(r for r in metric_rows(out) if "timing_s/step" in r)]


def run(name: str, overrides: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    launch(train_command(out, overrides), out, timeout_s)
    rows = metric_rows(out)
    steps = [r for r in rows if "timing_s/step" in r]
    wall = sum(r["timing_s/step"] for r in steps)
    trained = int(sum(r.get("training/responses", 0) for r in steps))
    if not trained or wall <= 0:
        raise RunFailed(f"trained nothing ({len(steps)} steps logged)")
    return {"config": name, "wall_s": wall, "process_s": time.perf_counter() - start,
            "steps": len(steps), "trained_responses": trained, "samples_per_s": trained / wall,
            "trainer_idle_ratio": _mean(steps, "trainer/idle_ratio"),
            "rollouter_idle_ratio": _mean(steps, "rollouter/idle_ratio"),
            "wait_prev_gen_s": _mean(steps, "timing_s/wait_prev_gen"),
            "final_val_score": next((r["val/score/mean"] for r in reversed(rows) if "val/score/mean" in r), 0.0)}


def failure(name: str, error: RunFailed, out: Path) -> dict[str, Any]:
    """A failed configuration's record: why, and the last lines of its stderr."""
    err = out / "stderr.log"
    tail = err.read_text(errors="replace").splitlines()[-STDERR_LINES:] if err.exists() else []
    return {"config": name, "error": str(error), "stderr_tail": tail}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def table(results: list[dict], args: argparse.Namespace) -> str:
    """The results as a markdown table, speed-up over colocated (when it ran)."""
    base = next((r["wall_s"] for r in results if r["config"] == "colocated"), None)
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| pipeline | wall s | speed-up | samples/s | trainer idle | rollouter idle | wait_prev_gen s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        speed = f"{base / r['wall_s']:.2f}×" if base else "–"
        lines.append(f"| {r['config']} | {r['wall_s']:.1f} | {speed} | {r['samples_per_s']:.1f} | "
                     f"{fmt(r['trainer_idle_ratio'])} | {fmt(r['rollouter_idle_ratio'])} | "
                     f"{fmt(r['wait_prev_gen_s'])} |")
    cmd = "PYTHONPATH=. python bench/pipelines.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if k not in ("out", "runs_dir", "override") and v not in ("", 0, None, False))
    return "\n".join([f"Command: `{cmd}`", "", *lines])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--micro-tokens", type=int, default=0,
                   help="actor.ppo_micro_batch_tokens (default: not passed, the device's budget applies)")
    p.add_argument("--override", action="append", default=[], help="KEY=VALUE for every configuration (repeatable)")
    p.add_argument("--only", default="", help="comma-separated config names (default: all)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="per configuration; its process group is killed")
    p.add_argument("--out", default="", help="default: bench/results/pipelines.json (--gpu: pipelines_gpu.json)")
    p.add_argument("--runs-dir", default="", help="keep each run's outputs here (default: a temp dir)")
    p.add_argument("--gpu", action="store_true", help="one GPU, a Qwen2-0.5B-shaped body (see above)")
    p.add_argument("--merge", action="store_true", help="add to the results already in --out (and --steps-out)")
    p.add_argument("--steps-out", default="", help="JSON: each configuration's per-step timing_s/* and perf/*")
    args = p.parse_args(argv)
    args.out = args.out or str(ROOT / "bench" / "results" / ("pipelines_gpu.json" if args.gpu else "pipelines.json"))
    return args


def write(args: argparse.Namespace, results: list[dict], failed: list[dict]) -> None:
    """The results so far, replacing the file whole (a stopped bench leaves what had finished);
    with `--steps-out`, every configuration's steps beside them."""
    replace_json(Path(args.out), {"args": vars(args), "results": results, "failed": failed})
    if args.steps_out:
        replace_json(Path(args.steps_out), {r["config"]: r["step_metrics"] for r in [*results, *failed]})


def replace_json(out: Path, value: Any) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(out)


def earlier(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """With `--merge`, the results and failures the results file already holds (else none)."""
    out = Path(args.out)
    if not args.merge or not out.exists():
        return [], []
    held = json.loads(out.read_text())
    return held.get("results", []), held.get("failed", [])


def chosen(args: argparse.Namespace) -> list[str]:
    """The configurations this invocation runs, in their table's order."""
    return [n for n in (GPU_CONFIGS if args.gpu else CONFIGS) if not args.only or n in args.only.split(",")]


def run_all(args: argparse.Namespace, root: Path) -> list[dict]:
    """Each chosen configuration in a fresh directory under `root`, written as it finishes."""
    configs = GPU_CONFIGS if args.gpu else CONFIGS
    names = chosen(args)
    device = [*ON_GPU, f"model.path={qwen_body(root)}"] if args.gpu else []
    results, failed = earlier(args)
    for name in names:
        overrides = [*common(args), *device, *configs[name]]
        out = fresh_dir(root, name)
        try:
            results.append(run(name, overrides, out, args.timeout_s)
                           | {"overrides": overrides, "run_dir": str(out), "step_metrics": step_metrics(out)})
            print(json.dumps(results[-1]), flush=True)
        except RunFailed as e:
            failed.append(failure(name, e, out)
                          | {"overrides": overrides, "run_dir": str(out), "step_metrics": step_metrics(out)})
            print(f"{name}: FAILED, {e}; stderr ends:", *failed[-1]["stderr_tail"][-5:], sep="\n  ", flush=True)
        write(args, results, failed)
    return results


def main() -> None:
    args = parse()
    # stopped (the GPU session's timeout sends SIGTERM): unwind, so `launch` kills the run's group
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs_dir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = run_all(args, root)
    print(table(results, args))
    failed = [f["config"] for f in earlier(argparse.Namespace(out=args.out, merge=True))[1]]
    sys.exit(1 if set(failed) & set(chosen(args)) else 0)  # a failed configuration fails the session's step


if __name__ == "__main__":
    main()
