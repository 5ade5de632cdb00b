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

`--gpu` does the same for `bench/pipelines.py --gpu` (one GPU, the Qwen2-0.5B-shaped body):
the start profile is h800-qwen2.5-7b's H100-class device (the same data-sheet numbers) with the
body's shape, fitted to the colocated run alone (no core scaling to fit). The simulator gives
each side of a decoupled run its own GPU, where the measured run shares one between two
processes, so its decoupled predictions are the no-contention bound; the error says how much
sharing costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.sim.fit import fit_decode_split, fit_profile, fit_scaling, measured_phases
from asyncrl.sim.profile import PROFILE_DIR, Profile, load_profile, save_profile
from asyncrl.sim.run import simulate
from asyncrl.sim.summary import read_steps, summarise

ROOT = Path(__file__).resolve().parents[1]
FITTED_ON = ("colocated", "colocated 1 core")  # colocated only: the rest is predicted
GPU_BODY = dict(name="h100-qwen05b-body", params_b=0.36, n_layers=24, hidden=896, kv_bytes_per_token=12288,
                description="H100-class GPU (the h800-qwen2.5-7b data-sheet numbers) running bench/pipelines.py "
                            "--gpu's Qwen2-0.5B-shaped body in bf16; efficiencies fitted to its colocated run")


def start_profile(gpu: bool) -> Profile:
    if not gpu:
        return load_profile("cpu-tiny")
    return dataclasses.replace(load_profile("h800-qwen2.5-7b"), **GPU_BODY)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="bench/pipelines.py --gpu's runs (see above)")
    ap.add_argument("--pipelines", default="", help="default: bench/results/pipelines.json (--gpu: pipelines_gpu.json)")
    ap.add_argument("--out", default="", help="default: bench/results/sim_vs_measured.json (--gpu: ..._gpu.json)")
    ap.add_argument("--write", action="store_true", help="make the fitted profile the built-in cpu-tiny")
    args = ap.parse_args()
    tag = "_gpu" if args.gpu else ""
    args.pipelines = args.pipelines or str(ROOT / f"bench/results/pipelines{tag}.json")
    args.out = args.out or str(ROOT / f"bench/results/sim_vs_measured{tag}.json")
    runs = json.loads(Path(args.pipelines).read_text())["results"]
    base = next(r for r in runs if r["config"] == "colocated")
    prompt_len = round(read_steps(Path(base["run_dir"]) / "metrics.jsonl")[0]["prompt_length/mean"])
    start = start_profile(args.gpu)
    fitted = ROOT / f"bench/results/{start.name}-fitted.yaml"
    save_profile(start, fitted)
    sim_keys = [f"sim.profile={fitted}", f"sim.prompt_length={prompt_len}"]
    if args.gpu:
        sim_keys += ["rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    fitted_runs = [(load_config(None, [*r["overrides"], *sim_keys]), Path(r["run_dir"]) / "metrics.jsonl")
                   for r in runs if r["config"] in FITTED_ON]
    targets = [(cfg, measured_phases(path)) for cfg, path in fitted_runs]
    profile = fit_decode_split(fitted_runs, fit_profile(targets, start))
    if len(targets) > 1:
        profile = fit_scaling(targets, profile)
    save_profile(dataclasses.replace(profile, description=start.description), fitted)
    if args.write and not args.gpu:
        save_profile(dataclasses.replace(profile, description=start.description), PROFILE_DIR / "cpu-tiny.yaml")
    rows = []
    for r in runs:  # the fitted runs too: their error is the fit's, the others' the prediction's
        cfg = load_config(None, [*r["overrides"], *sim_keys, "trainer.logger=[jsonl]",
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
