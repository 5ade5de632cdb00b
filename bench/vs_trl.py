"""asyncrl's colocated pipeline and TRL's GRPOTrainer side by side, alternating, on one machine.

Three workloads, each the trl_peer workload (the tiny model, built-in arithmetic task, 32
prompts x 8, two optimizer updates per step, 2 threads):
- `short`: our defaults (responses end at EOS, at most 16 tokens);
- `forced128` / `forced256`: every response exactly 128 / 256 tokens (EOS suppressed:
  `rollout.ignore_eos=true` here, `min_new_tokens` there).

For each workload, `--pairs` pairs of runs, the order flipped every pair (TRL first, then asyncrl
first, ...), so a drift in machine speed hits both. A run's seconds per step is the mean over its
steps after the first (warm-up); the result is the median over pairs, the per-pair speed-up
(TRL s/step / asyncrl s/step) and its spread. The 1-minute load average before each run is
recorded: run it on an idle machine (`uptime` near 0).

    PYTHONPATH=. .venv-bench/bin/python bench/vs_trl.py --pairs 3   # ./run.sh bench vs_trl

Writes bench/results/vs_trl.json. TRL is a bench-only dependency (the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS: dict[str, tuple[int, int | None]] = {"short": (8, None), "forced128": (4, 128), "forced256": (4, 256)}
"""name -> (steps per run, forced response length or None)."""


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(cmd: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    subprocess.run(cmd, cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def trl_run(steps: int, forced: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trl.json"
        args = ["--max-len", str(forced), "--forced"] if forced else []
        run([sys.executable, "bench/trl_peer.py", "--steps", str(steps), "--out", str(out), *args])
        r = json.loads(out.read_text())
    step_s = [s["s"] for s in r["per_step"]][1:]
    return {"s_per_step": statistics.mean(step_s), "steps": step_s,
            "completion_tokens_mean": r["completion_tokens_mean"]}


def ours_run(steps: int, forced: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["rollout.ignore_eos=true", f"data.max_response_length={forced}"] if forced else []
        run([sys.executable, "-m", "asyncrl.cli", "train", f"trainer.output_dir={tmp}",
             f"trainer.total_training_steps={steps}", "trainer.test_freq=0", "trainer.val_before_train=false",
             "trainer.logger=[jsonl]", "num_threads=2", *extra])
        rows = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing_s/step" in r][1:]
    phases = {k.split("/")[1]: statistics.mean(r.get(k, 0.0) for r in rows)
              for k in ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/update_actor")}
    return {"s_per_step": statistics.mean(r["timing_s/step"] for r in rows),
            "steps": [r["timing_s/step"] for r in rows], "phases": phases,
            "completion_tokens_mean": statistics.mean(r["response_length/mean"] for r in rows)}


def workload(name: str, pairs: int) -> dict[str, Any]:
    steps, forced = WORKLOADS[name]
    trl: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    for i in range(pairs):
        order = [("trl", trl_run, trl), ("asyncrl", ours_run, ours)]
        for who, fn, into in order if i % 2 == 0 else order[::-1]:
            before = load()
            into.append(fn(steps, forced) | {"load_before": before})
            print(f"{name} pair {i} {who}: {into[-1]['s_per_step']:.3f} s/step (load {before:.2f})", flush=True)
    speedups = [t["s_per_step"] / o["s_per_step"] for t, o in zip(trl, ours)]
    completions = 32 * 8
    trl_s = statistics.median(r["s_per_step"] for r in trl)
    ours_s = statistics.median(r["s_per_step"] for r in ours)
    return {"steps_per_run": steps, "forced_tokens": forced, "trl": trl, "asyncrl": ours,
            "trl_s_per_step": trl_s, "asyncrl_s_per_step": ours_s,
            "trl_completions_per_s": completions / trl_s, "asyncrl_completions_per_s": completions / ours_s,
            "speedup_median": statistics.median(speedups), "speedup_min": min(speedups),
            "speedup_max": max(speedups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", default=str(ROOT / "bench/results/vs_trl.json"))
    args = ap.parse_args()
    import trl  # noqa: F401  (fail before any run when the bench extra is missing)

    results = {name: workload(name, args.pairs) for name in args.workloads.split(",")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pairs": args.pairs, "cpus": os.cpu_count(), "results": results}, indent=1) + "\n")
    for name, r in results.items():
        print(f"{name}: TRL {r['trl_s_per_step']:.2f} s/step, asyncrl {r['asyncrl_s_per_step']:.2f} s/step, "
              f"speed-up {r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})")


if __name__ == "__main__":
    main()
