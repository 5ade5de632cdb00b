"""The benchmark suite in one command: every script under bench/, then docs/benchmarks.md.

    ./run.sh bench                 # = python bench/run_all.py in the bench environment (TRL, matplotlib)
    ./run.sh bench --only sim      # some parts; --report-only rewrites the docs from bench/results

Parts (each writes bench/results/<part>.json; `bench/report.py` turns them into
docs/benchmarks.md and docs/img/*.png):
- pipelines:  colocated, one-step-off, fully async a-d on the long-tail workload (bench/pipelines.py)
- sim:        the simulator fitted to the measured colocated run, predicting every pipeline run
              (bench/sim_vs_measured.py)
- peer:       TRL GRPOTrainer vs asyncrl colocated on the default task (bench/trl_peer.py + ours)
- engine:     TorchEngine vs HF generate (bench/engine.py)
- gpu_engine: the engine's static (CUDA-graph) path against its decode floor and HF generate,
              here in its CPU mode (bench/gpu_engine.py --device cpu; on a GPU: --device cuda)
- sync:       weight sync vs the memory-copy bound (bench/weight_sync.py)
- calibrate:  the h20-qwen2.5-7b profile vs SPEC §6 (bench/calibrate.py)
- plan:       a 400-step 128-GPU schedule (speed of the simulator) and every mode compared on it
- sim_speed:  the 400-step 128-GPU colocated and fully async 64:64 schedules timed (bench/sim_speed.py)
- faults:     what SIGTERM, SIGKILL, a failing or hung reward, a crashing reward worker and a full
              disk cost, and that each resume trains every prompt once (bench/faults.py;
              docs/reliability.md)
- long_tail_sim: RollPacker's remedies added one by one on its 7B/14B/32B settings, simulated
              (bench/long_tail_sim.py; docs/long_tail_bench.md)
- long_tail_cpu: colocated vs tail batching vs + reward scheduler + stream trainer on the tiny
              model, and code rewards hidden behind generation (bench/long_tail_cpu.py)
Run it on an otherwise idle machine: each part measures wall-clock on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results"
PY = sys.executable
PLAN_YAML = "examples/dapo_qwen7b_h20.yaml"  # SPEC §6's DAPO workload, 128 GPUs colocated
SPLIT = ["rollout.nnodes=8", "rollout.n_gpus_per_node=8", "trainer.nnodes=8"]  # 64 rollout + 64 trainer

def sh(*args: str) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})


def part_pipelines() -> None:
    sh(PY, "bench/pipelines.py", "--runs-dir", "bench/runs")


def part_sim() -> None:
    sh(PY, "bench/sim_vs_measured.py", "--write")


def part_peer() -> None:
    sh(PY, "bench/vs_trl.py", "--out", str(RESULTS / "vs_trl.json"))


def part_engine() -> None:
    sh(PY, "bench/engine.py", "--models", "tiny")


def part_gpu_engine() -> None:
    sh(PY, "bench/gpu_engine.py", "--device", "cpu")


def part_sync() -> None:
    sh(PY, "bench/weight_sync.py", "--models", "tiny,smollm2")


def part_calibrate() -> None:
    sh(PY, "bench/calibrate.py", "--write")


def python_loop_seconds() -> float:
    """How fast this VM runs plain Python right now (its speed drifts ~2x): a 10M-step loop."""
    start, x = time.perf_counter(), 0
    for i in range(10_000_000):
        x += i
    return time.perf_counter() - start


def part_plan() -> None:
    quiet = "trainer.logger=[jsonl]"
    with tempfile.TemporaryDirectory() as tmp:
        loop_s = python_loop_seconds()
        start = time.perf_counter()
        done = subprocess.run([PY, "-m", "asyncrl.cli", "sim", PLAN_YAML, quiet, f"trainer.output_dir={tmp}/one"],
                              cwd=ROOT, check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        simulated = float(re.search(r"in ([0-9.]+) s;", done.stderr).group(1))
        sh(PY, "-m", "asyncrl.cli", "sim", PLAN_YAML, *SPLIT, "trainer.total_training_steps=50", quiet,
           f"trainer.output_dir={tmp}/cmp", "--compare", "modes")
        compare = json.loads((Path(tmp) / "cmp/compare.json").read_text())
    (RESULTS / "plan.json").write_text(json.dumps({
        "speed": {"command": f"asyncrl sim {PLAN_YAML} {quiet}", "seconds": seconds, "simulation_s": simulated,
                  "python_loop_10M_s": loop_s},
        "compare": {"command": f"asyncrl sim {PLAN_YAML} {' '.join(SPLIT)} trainer.total_training_steps=50 "
                               f"{quiet} --compare modes", "rows": compare}}, indent=1))


def part_sim_speed() -> None:
    sh(PY, "bench/sim_speed.py")


def part_faults() -> None:
    sh(PY, "bench/faults.py")


def part_long_tail_sim() -> None:
    sh(PY, "bench/long_tail_sim.py")


def part_long_tail_cpu() -> None:
    sh(PY, "bench/long_tail_cpu.py")


PARTS = {"pipelines": part_pipelines, "sim": part_sim, "peer": part_peer, "engine": part_engine,
         "gpu_engine": part_gpu_engine, "sync": part_sync, "calibrate": part_calibrate, "plan": part_plan,
         "sim_speed": part_sim_speed, "faults": part_faults,
         "long_tail_sim": part_long_tail_sim, "long_tail_cpu": part_long_tail_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma list of parts: {','.join(PARTS)}")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if not args.report_only:
        for name, part in PARTS.items():
            if not args.only or name in args.only.split(","):
                start = time.perf_counter()
                part()
                print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    sh(PY, "bench/report.py")


if __name__ == "__main__":
    main()
