"""The simulator's predictions for the CPU pipeline runs of bench/pipelines.py, next to the
measurements.

1. Fit the `cpu-tiny` profile to the colocated runs only: 2 cores per phase and 1 core per
   phase, from their per-phase times: the rollout, log-prob and update efficiencies, how
   generation splits between per-step and per-token cost (from the step rows), and how speed
   scales from 1 to 2 cores (`asyncrl.sim.fit`).
2. Simulate every run of bench/results/pipelines.json (same overrides, same long-tail lengths
   via rollout.length_from_prompt) with that profile: one-step-off, the four fully async runs
   and colocated with tail batching are pure predictions.
3. Report measured vs predicted wall-clock, samples/s and idle ratios, and the error.

    PYTHONPATH=. python bench/pipelines.py --runs-dir bench/runs       # measure (~idle machine)
    PYTHONPATH=. python bench/sim_vs_measured.py --write                # fit, predict, compare
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.sim.fit import fit_decode_split, fit_profile, fit_scaling, measured_phases
from asyncrl.sim.profile import PROFILE_DIR, load_profile, save_profile
from asyncrl.sim.run import simulate
from asyncrl.sim.summary import read_steps, summarise

ROOT = Path(__file__).resolve().parents[1]
FITTED_ON = ("colocated", "colocated 1 core")  # colocated only: the rest is predicted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipelines", default=str(ROOT / "bench/results/pipelines.json"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/sim_vs_measured.json"))
    ap.add_argument("--write", action="store_true", help="make the fitted profile the built-in cpu-tiny")
    args = ap.parse_args()
    runs = json.loads(Path(args.pipelines).read_text())["results"]
    base = next(r for r in runs if r["config"] == "colocated")
    prompt_len = round(read_steps(Path(base["run_dir"]) / "metrics.jsonl")[0]["prompt_length/mean"])
    sim_keys = ["sim.profile=cpu-tiny", f"sim.prompt_length={prompt_len}"]
    fitted_runs = [(load_config(None, [*r["overrides"], *sim_keys]), Path(r["run_dir"]) / "metrics.jsonl")
                   for r in runs if r["config"] in FITTED_ON]
    targets = [(cfg, measured_phases(path)) for cfg, path in fitted_runs]
    start = load_profile("cpu-tiny")
    profile = fit_scaling(targets, fit_decode_split(fitted_runs, fit_profile(targets, start)))
    fitted = ROOT / "bench/results/cpu-tiny-fitted.yaml"
    save_profile(dataclasses.replace(profile, description=start.description), fitted)
    if args.write:
        save_profile(dataclasses.replace(profile, description=start.description), PROFILE_DIR / "cpu-tiny.yaml")
    rows = []
    for r in runs:  # the fitted runs too: their error is the fit's, the others' the prediction's
        cfg = load_config(None, [*r["overrides"], *sim_keys, f"sim.profile={fitted}", "trainer.logger=[jsonl]",
                                 f"trainer.output_dir={Path(r['run_dir']) / 'sim'}"])
        simulated = simulate(cfg, log=lambda _: None)  # like the measured side: the sum of step times
        predicted = dataclasses.replace(summarise(cfg, Path(cfg.trainer.output_dir)), sim_wall_s=simulated.sim_wall_s)
        measured = summarise(cfg, Path(r["run_dir"]))
        rows.append({"config": r["config"], "measured": measured.as_dict(), "predicted": predicted.as_dict(),
                     "wall_error": predicted.total_s / measured.total_s - 1,
                     "fitted": r["config"] in FITTED_ON})
        print(f"{r['config']}: measured {measured.total_s:.1f} s, predicted {predicted.total_s:.1f} s "
              f"({rows[-1]['wall_error']:+.0%})", flush=True)
    Path(args.out).write_text(json.dumps({"profile": str(fitted.relative_to(ROOT)), "fitted_on": FITTED_ON,
                                          "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
