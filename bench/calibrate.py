"""Calibrate the h20-qwen2.5-7b profile to the colocated rows of SPEC §6 and report the error.

SPEC §6 gives per-phase seconds of colocated DAPO steps (Qwen2.5-Math-7B, H20, n=16, 512
prompts, mini-batch 32, max response 28K) on 32, 64 and 128 GPUs, but not the response lengths
of those three runs. So the calibration has two parts:
  1. per row, the median response length (lognormal, sigma 0.9, cap 28K) is chosen so the
     simulated `update_actor` matches (the update is close to proportional to tokens);
  2. one profile for all rows: the rollout and log-prob efficiencies are fitted so `gen` and
     `old_log_prob` match in the geometric mean over the rows (`asyncrl.sim.fit`).
Parts 1 and 2 alternate for a few rounds. Then each row is simulated afresh (more steps) and the
per-phase error is reported. 9 measured numbers, 5 fitted parameters.

    PYTHONPATH=. python bench/calibrate.py            # writes bench/results/calibration.json and,
    PYTHONPATH=. python bench/calibrate.py --write    # with --write, the built-in profile YAML
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.config_schema import Config
from asyncrl.sim.fit import fit_profile, simulated_phases
from asyncrl.sim.profile import PROFILE_DIR, Profile, load_profile, save_profile

ROOT = Path(__file__).resolve().parents[1]
ROWS = {  # GPUs: SPEC §6 per-phase seconds
    32: {"step": 790.10, "gen": 357.41, "old_log_prob": 107.71, "update_actor": 313.81},
    64: {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41},
    128: {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81},
}
EXAMPLE = str(ROOT / "examples/dapo_qwen7b_h20.yaml")  # the same workload users plan with


def row_config(gpus: int, median: float, steps: int) -> Config:
    return load_config(EXAMPLE, ["trainer.logger=[jsonl]", f"trainer.nnodes={gpus // 8}",
                                 f"sim.length_median={median:.1f}", f"trainer.total_training_steps={steps}"])


def fit_median(gpus: int, profile: Profile, guess: float, steps: int) -> float:
    """Secant in log-log space on update_actor(median)."""
    target = ROWS[gpus]["update_actor"]
    x0, y0 = math.log(guess), math.log(simulated_phases(row_config(gpus, guess, steps), profile)["update_actor"])
    x1 = x0 + 0.5 * (math.log(target) - y0)
    for _ in range(4):
        y1 = math.log(simulated_phases(row_config(gpus, math.exp(x1), steps), profile)["update_actor"])
        if abs(y1 - math.log(target)) < 0.01 or abs(y1 - y0) < 1e-9:
            break
        x0, y0, x1 = x1, y1, x1 + (math.log(target) - y1) * (x1 - x0) / (y1 - y0)
    return math.exp(x1)


def calibrate(profile: Profile, rounds: int, steps: int) -> tuple[Profile, dict[int, float]]:
    medians = {g: 1000.0 for g in ROWS}
    for r in range(rounds):
        medians = {g: fit_median(g, profile, medians[g], steps) for g in ROWS}
        targets = [(row_config(g, medians[g], steps), ROWS[g]) for g in ROWS]
        profile = fit_profile(targets, profile, rounds=2, phases=("gen", "old_log_prob"),
                              log=lambda m: print(m, flush=True))
        print(f"round {r + 1}: medians {({g: round(m) for g, m in medians.items()})}", flush=True)
    return profile, medians


def report(profile: Profile, medians: dict[int, float], steps: int) -> list[dict[str, float]]:
    rows = []
    for g, measured in ROWS.items():
        sim = simulated_phases(row_config(g, medians[g], steps), profile)
        rows.append({"gpus": g, "length_median": round(medians[g]), **{
            f"{ph}_{kind}": v for ph in ("gen", "old_log_prob", "update_actor", "step")
            for kind, v in (("measured", measured[ph]), ("sim", sim[ph]),
                            ("error", sim[ph] / measured[ph] - 1))}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="simulated steps per fitting run")
    ap.add_argument("--check-steps", type=int, default=8, help="simulated steps per row in the report")
    ap.add_argument("--write", action="store_true", help="overwrite the built-in profile")
    args = ap.parse_args()
    start = load_profile("h20-qwen2.5-7b")
    profile, medians = calibrate(start, args.rounds, args.steps)
    rows = report(profile, medians, args.check_steps)
    for r in rows:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
    out = ROOT / "bench/results/calibration.json"
    out.write_text(json.dumps({"rows": rows, "profile": dataclasses.asdict(profile),
                               "command": "PYTHONPATH=. python bench/calibrate.py --write"}, indent=1))
    if args.write:
        save_profile(profile, PROFILE_DIR / "h20-qwen2.5-7b.yaml")


if __name__ == "__main__":
    main()
