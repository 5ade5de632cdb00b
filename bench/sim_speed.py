"""How fast the simulator plans: wall-clock seconds of the 400-step, 128-GPU DAPO schedule
(`examples/dapo_qwen7b_h20.yaml`, 512 prompts x 16 responses a step) colocated, and fully async
on a 64 rollout + 64 trainer split; the issue's target is under 60 s each on the 2-core VM.

    python bench/sim_speed.py            # writes bench/results/sim_speed.json

Each run is a fresh `python -m asyncrl.cli sim` process (imports included), timed end to end,
next to a plain-Python loop that says how fast the VM itself ran at the time (it drifts ~2x).
Not measured here: the modes' predictions (the `plan` part of bench/run_all.py compares them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench/results/sim_speed.json"
YAML = "examples/dapo_qwen7b_h20.yaml"
RUNS = {
    "colocated_128": [],
    "fully_async_64_64": ["rollout.nnodes=8", "rollout.n_gpus_per_node=8", "trainer.nnodes=8",
                          "pipeline=fully_async", "async_training.require_batches=4",
                          "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true"],
}
TARGET_S = 60.0


def python_loop_seconds() -> float:
    """How fast this VM runs plain Python right now: a 10M-step loop."""
    start, x = time.perf_counter(), 0
    for i in range(10_000_000):
        x += i
    return time.perf_counter() - start


def time_run(overrides: list[str], out_dir: str) -> dict[str, object]:
    """One simulated schedule: wall seconds of the process, the loop's own seconds, steps."""
    args = ["-m", "asyncrl.cli", "sim", YAML, *overrides, "trainer.logger=[jsonl]", f"trainer.output_dir={out_dir}"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - start
    found = re.search(r"simulated (\d+) steps \(([0-9.]+) virtual s\) in ([0-9.]+) s", done.stderr + done.stdout)
    assert found, "the sim command's last line changed: update the pattern"
    return {"command": "python -m asyncrl.cli sim " + " ".join([YAML, *overrides, "trainer.logger=[jsonl]"]),
            "seconds": round(seconds, 1), "simulation_s": float(found[3]), "steps": int(found[1]),
            "virtual_s": float(found[2]), "under_target": seconds < TARGET_S}


def main() -> None:
    results: dict[str, object] = {"target_s": TARGET_S, "python_loop_10M_s": round(python_loop_seconds(), 3)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in RUNS.items():
            results[name] = time_run(overrides, f"{tmp}/{name}")
            print(name, results[name], flush=True)
    RESULT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
