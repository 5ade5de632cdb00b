"""docs/benchmarks.md and docs/img/*.png from bench/results/*.json (written by bench/run_all.py).

Every number in the page is read from a results file here; nothing is typed in by hand.
A part that has not been run yet is listed as such.

    python bench/report.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS, IMG = ROOT / "bench/results", ROOT / "docs/img"


def load(name: str) -> Any:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def pipelines_section(data: Any, sim: Any) -> list[str]:
    if not data:
        return ["_not run yet: `./run.sh bench --only pipelines`_"]
    rows = data["results"]
    base = next(r for r in rows if r["config"] == "colocated")["wall_s"]
    out = ["| pipeline | wall s | speed-up | samples/s | trainer idle | rollout idle | final val score |",
           "|---|---|---|---|---|---|---|"]
    by_sim = {r["config"]: r for r in (sim or {}).get("rows", [])}
    for r in rows:
        s = by_sim.get(r["config"])
        t_idle = s["measured"]["trainer_idle"] if s else r["trainer_idle_ratio"]
        r_idle = s["measured"]["rollout_idle"] if s else r["rollouter_idle_ratio"]
        out.append(f"| {r['config']} | {r['wall_s']:.1f} | {base / r['wall_s']:.2f}× | {r['samples_per_s']:.1f} "
                   f"| {f(t_idle)} | {f(r_idle)} | {f(r['final_val_score'])} |")
    a = data["args"]
    cmd = (f"python bench/pipelines.py --steps {a['steps']} --prompts {a['prompts']} --n {a['n']} "
           f"--max-len {a['max_len']}")
    _bar_plot("pipelines.png", [r["config"] for r in rows], [r["wall_s"] for r in rows], "wall-clock s (512 responses)")
    return [f"Command: `{cmd}`", "", *out, "", "![pipelines](img/pipelines.png)", "",
            "The validation score is not a learning result: the tiny model was never taught the long-tail task; "
            "learning per pipeline is asserted by the end-to-end tests on the arithmetic task.", "",
            "How to read it: one-step-off hides generation of batch k+1 behind training on batch k even with one "
            "core per side; mode (a) (on-policy, a sync after every small update) makes both sides wait on each "
            "other; a larger `trigger_parameter_sync_step` or `staleness_threshold` gives the rollouter room. "
            "On this CPU a decode step costs more at batch 64 than at batch 1, so keeping the batch full pays "
            "less than on GPUs; the simulator models the GPU regime (below)."]


def sim_section(sim: Any) -> list[str]:
    if not sim:
        return ["_not run yet: `./run.sh bench --only pipelines,sim`_"]
    out = ["| pipeline | measured s | predicted s | error | measured trainer/rollout idle | predicted |",
           "|---|---|---|---|---|---|"]
    for r in sim["rows"]:
        m, p = r["measured"], r["predicted"]
        out.append(f"| {r['config']} | {m['total_s']:.1f} | {p['total_s']:.1f} | {r['wall_error']:+.0%} "
                   f"| {m['trainer_idle']:.2f} / {m['rollout_idle']:.2f} "
                   f"| {p['trainer_idle']:.2f} / {p['rollout_idle']:.2f} |")
    names = [r["config"] for r in sim["rows"]]
    _bar_plot("sim_vs_measured.png", names, [r["measured"]["total_s"] for r in sim["rows"]], "wall-clock s",
              second=[r["predicted"]["total_s"] for r in sim["rows"]], labels=("measured", "simulated"))
    return ["Command: `python bench/sim_vs_measured.py --write` (after `bench/pipelines.py --runs-dir bench/runs`).",
            f"Profile: `{sim['profile']}` fitted to the measured {' and '.join(sim['fitted_on'])} runs "
            "(efficiencies and 1→2-core scaling); the fully async rows are predictions.",
            "", *out, "", "![sim vs measured](img/sim_vs_measured.png)"]


def peer_section(trl: Any, ours: Any) -> list[str]:
    if not trl or not ours:
        return ["_not run yet: `./run.sh bench --only peer`_"]
    return ["| framework | s/step | completions/s | steps timed |", "|---|---|---|---|",
            f"| {trl['framework']} | {trl['s_per_step']:.2f} | {trl['completions_per_s']:.0f} | {trl['timed_steps']} |",
            f"| asyncrl colocated | {ours['s_per_step']:.2f} | {ours['completions_per_s']:.0f} | {ours['steps']} |",
            "", f"Commands: `python bench/trl_peer.py` and `{ours['command']}` (first step excluded in both).",
            "asyncrl phases per step: " + ", ".join(f"{k} {v:.2f} s" for k, v in ours["phases"].items()) + "."]


def engine_section(engine: Any, sync: Any) -> list[str]:
    out = []
    if engine:
        out += ["| model | system | batch | tokens/s |", "|---|---|---|---|"]
        out += [f"| {r['model']} | {r['system']} | {r['batch']} | {r['tokens_per_s']:.0f} |" for r in engine["rows"]]
        out += ["", "Command: `python bench/engine.py --models tiny` (details: [engine.md](engine.md))", ""]
    if sync:
        out += ["| model | transport | MB | median s | GB/s |", "|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['transport']} | {r['bytes'] / 1e6:.1f} | {r['median_s']:.4f} "
                f"| {r['gb_per_s']:.2f} |"
                for r in sync["rows"]]
        out += ["", "Command: `python bench/weight_sync.py --models tiny,smollm2` "
                "(details: [weight_sync.md](weight_sync.md))"]
    return out or ["_not run yet_"]


def calibration_section(cal: Any) -> list[str]:
    if not cal:
        return ["_not run yet: `./run.sh bench --only calibrate`_"]
    out = ["| GPUs | fitted median length | phase | SPEC s | simulated s | error |", "|---|---|---|---|---|---|"]
    for r in cal["rows"]:
        for ph in ("gen", "old_log_prob", "update_actor", "step"):
            out.append(f"| {r['gpus']} | {r['length_median']} | {ph} | {r[ph + '_measured']:.1f} "
                       f"| {r[ph + '_sim']:.1f} | {r[ph + '_error']:+.1%} |")
    worst = max(abs(r[p + "_error"]) for r in cal["rows"] for p in ("gen", "old_log_prob", "update_actor"))
    return [f"Command: `{cal['command']}`. Largest per-phase error: {worst:.1%}.", "", *out]


def plan_section(plan: Any) -> list[str]:
    if not plan:
        return ["_not run yet: `./run.sh bench --only plan`_"]
    rows = plan["compare"]["rows"]
    sp = plan["speed"]
    out = [f"Speed: `{sp['command']}` (400 steps x 512 prompts x 16 responses = 3.3M responses on 128 modelled "
           f"GPUs): **{sp['simulation_s']:.0f} s** of simulation, {sp['seconds']:.0f} s for the whole command "
           f"(imports, trace export). The VM's speed drifts (the same 400 steps took 59-85 s over one session); "
           f"a 10M-step Python loop took {sp['python_loop_10M_s']:.2f} s just before this run.", "",
           f"Command: `{plan['compare']['command']}`", "",
           "| run | total (50 steps) | samples/s | trainer idle | rollout idle | lag mean/max | partial |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['total_s'] / 3600:.1f} h | {r['samples_per_s']:.1f} | {r['trainer_idle']:.2f} "
                   f"| {r['rollout_idle']:.2f} | {r['version_lag_mean']:.2f}/{r['version_lag_max']:.0f} "
                   f"| {r['partial_ratio']:.2f} |")
    _bar_plot("plan128.png", [r["label"] for r in rows], [r["total_s"] / 3600 for r in rows], "hours for 50 steps")
    return [*out, "", "![plan](img/plan128.png)"]


def _bar_plot(name: str, names: list[str], values: list[float], ylabel: str, second: list[float] | None = None,
              labels: tuple[str, str] = ("", "")) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots need the bench environment
        return
    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(names))
    width = 0.4 if second else 0.7
    ax.bar([x - (width / 2 if second else 0) for x in xs], values, width, label=labels[0] or None)
    if second:
        ax.bar([x + width / 2 for x in xs], second, width, label=labels[1])
        ax.legend()
    ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(IMG / name, dpi=100)
    plt.close(fig)


def main() -> None:
    sim = load("sim_vs_measured")
    parts = [
        "# Benchmarks", "",
        "Generated by `./run.sh bench` (`bench/run_all.py` → `bench/report.py`) from `bench/results/*.json`;",
        "rerun it to regenerate every number and plot. Machine: the 2-core project VM, no GPU, torch 2.13.0+cpu.",
        "Each CPU figure is one run on an otherwise idle machine: expect ±10% run to run.", "",
        "## Pipelines side by side (tiny model, long-tail workload, same 512 trained responses)", "",
        "`longtail` task with `rollout.length_from_prompt=true` (lognormal lengths, median ≈50, cap 256),",
        "16 prompts × 4 responses per step, 8 steps. Colocated uses both cores per phase; the decoupled",
        "pipelines give one core to rollout and one to training. Wall = sum of `timing_s/step`.", "",
        *pipelines_section(load("pipelines"), sim), "",
        "## The simulator's predictions for those runs", "", *sim_section(sim), "",
        "## Peer: TRL GRPOTrainer on the same model, task, group size and lengths (CPU)", "",
        *peer_section(load("trl_peer"), load("ours_vs_trl")), "",
        "## Engine vs HF generate; weight sync vs the memory-copy bound", "",
        *engine_section(load("engine"), load("weight_sync")), "",
        "## Simulator calibration: SPEC §6 colocated rows (Qwen2.5-Math-7B, H20, DAPO, n=16, 512 prompts)", "",
        *calibration_section(load("calibration")), "",
        "## Planning 128 GPUs with the simulator (64 rollout + 64 trainer GPUs, every mode)", "",
        *plan_section(load("plan")), "",
    ]
    (ROOT / "docs/benchmarks.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
