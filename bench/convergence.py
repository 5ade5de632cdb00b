"""Benchmark: does each pipeline and remedy keep colocated's accuracy? Score vs trained samples and
vs wall time, per mode, with seeds (issue 26).

Modes (`MODES`): colocated (the reference), one_step_off, fully async in its four modes
(on-policy streaming, stream off-policy T=2, staleness 0.5, staleness 0.5 + partial rollout), and
colocated with tail batching (its defaults, and with response speculation off: `tail_batching_r1`),
with the reward scheduler and with the stream trainer. Every run of
a task has the same model, learning rate, batch, group size and number of trained prompts
(`--steps` x `--batch`; fully async trains one update per `--batch` prompts, R = batch, so its
versions line up with colocated's steps), and validates at the same sample counts (every
`--val-every` updates' prompts; fully async: every `--val-every / T` versions).

Each (mode, task, seed) cell is one `asyncrl train` process in a fresh directory
(`bench/pipelines.py`'s `launch`: own process group, killed at its end or timeout). A finished
cell appends one line to the results file (`--out`, JSONL) at once, with the settings every cell
shares (`settings`: steps, batch, n, lr, validation, overrides); a rerun under the same settings skips
the cells already there, so a bench cut short resumes where it stopped, and a report reads only the
cells of its settings. Cells run mode after mode within a
seed (alternating modes, not one mode's seeds in a row), seeds in order. The expected wall time
of the whole matrix is printed at the start (`--cell-s`, default from the cells already done).

    PYTHONPATH=. python bench/convergence.py                       # the whole matrix, hours on 2 cores
    PYTHONPATH=. python bench/convergence.py --modes colocated,fa_partial --tasks arithmetic --seeds 3
    PYTHONPATH=. python bench/convergence.py --report              # verdicts, table and plots from --out

`--report` (also after a run) reads the results and writes the summary JSON (`--summary`): per
mode and task the curve's mean and spread over seeds, the final score (the mean of a run's last
three validations, or `--final-points` of them: `final_score`), the time to reach 90% of
colocated's final score, and the exploratory verdict of `parity` (the 95% interval of the paired
per-seed difference mode - colocated against -0.03: non-inferiority, not equivalence; the windows and
seed counts of these cells were not fixed in advance, so every summary is labelled exploratory, and
the pre-registered studies are `bench/study.py`'s), plus the PNG plots of score vs samples and
vs wall time (matplotlib, the bench extra) in docs/img.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.models.loading import SMOLLM2  # noqa: E402
from asyncrl.models.task_models import COUNTDOWN, LONGTAIL  # noqa: E402
from bench.cell_stats import read_run  # noqa: E402
from bench.pipelines import RunFailed, failure, fresh_dir, launch, metric_rows, train_command  # noqa: E402

FA = ["pipeline=fully_async", "async_training.require_batches=1"]
MODES: dict[str, tuple[list[str], int]] = {
    "colocated": (["pipeline=colocated"], 1),
    "one_step_off": (["pipeline=one_step_off"], 1),
    "fa_on_policy": ([*FA, "async_training.trigger_parameter_sync_step=1"], 1),
    "fa_stream_off_policy": ([*FA, "async_training.trigger_parameter_sync_step=2"], 2),
    "fa_stale": ([*FA, "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0.5"], 1),
    "fa_partial": ([*FA, "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true"], 1),
    "tail_batching": (["pipeline=colocated", "tail_batching.enable=true"], 1),
    "tail_batching_r1": (["pipeline=colocated", "tail_batching.enable=true", "tail_batching.response_speculation=1.0"],
                         1),
    "reward_scheduler": (["pipeline=colocated", "reward_scheduler.enable=true"], 1),
    "stream_trainer": (["pipeline=colocated", "stream_trainer.enable=true"], 1),
}
"""Mode -> (its keys, T: updates per weight version)."""
TASKS: dict[str, list[str]] = {
    "arithmetic": ["data.task=arithmetic"],
    "countdown": COUNTDOWN.run_overrides(),
    "longtail": [*LONGTAIL.run_overrides(), "data.max_response_length=200"],
    "longtail_partial": [f"model.path={LONGTAIL.name}", f"data.task={LONGTAIL.task}",
                         'data.task_options=["median=150.0", "sigma=0.3", "max_len=192"]',
                         "data.max_response_length=200"],
    "smollm2_addition": ["data.task=arithmetic", f"model.path={SMOLLM2}", "data.task_options=[high=49]",
                         "data.max_prompt_length=128", "data.max_response_length=32", "rollout.temperature=0.7",
                         "rollout.val_n=1", "rollout.val_temperature=0", "model.lora_rank=0",
                         "model.enable_gradient_checkpointing=false"],
}
"""Task -> its keys (its data.task among them), after the shared keys: arithmetic on `tiny` with the defaults
(the keys of the cells already in the results); countdown and longtail each on the tiny model warmed
up on it, with the task options it was warmed up on (`asyncrl.models.task_models`), longtail with room
for its answers; longtail_partial: the same model on answers about ten times longer (median 150, sigma 0.3, within
the 192 letters it was warmed up on), so that a response outlasts a small update and partial rollout
interrupts it (issue 38; calibrated in bench/protocols/partial_rollout.yaml); smollm2_addition: the
pretrained SmolLM2-135M-Instruct on a + b with a, b in 0..49,
validated greedy (one response per held-out problem), sampled at 0.7 (at 1.0 it rambles past 32
tokens and scores 0-3%), full fine-tuning without recomputed activations (docs/benchmarks.md)."""
MARGIN = 0.03
"""Parity: the 95% interval of (mode - colocated) final score lies above -MARGIN."""
FINAL_POINTS = 3
"""A run's final score is the mean of its last 3 validations (`final_score`). On arithmetic (5 seeds,
colocated vs fully async with partial rollout) the paired difference's spread over seeds was 0.057
with the last validation alone, 0.033 with the last two, 0.020 with the last three."""
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045)
"""Student's t 97.5% quantiles for 1..29 degrees of freedom (then 1.96)."""


def overrides(mode: str, task: str, seed: int, args: argparse.Namespace) -> list[str]:
    """One cell's keys: the mode's, then what every cell shares."""
    keys, per_version = MODES[mode]
    length = ([f"rollout.total_rollout_steps={args.steps * args.batch}",
               f"rollout.test_freq={max(args.val_every // per_version, 1)}"] if mode.startswith("fa_")
              else [f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.val_every}"])
    return [*keys, *length, f"seed={seed}", f"data.train_batch_size={args.batch}",
            f"actor.ppo_mini_batch_size={args.batch}", f"rollout.n={args.n}", f"actor.lr={args.lr}",
            f"data.val_size={args.val_size}", "rollout.val_n=4", "trainer.val_before_train=true",
            "trainer.logger=[jsonl]", "trainer.resume_mode=disable", "trainer.save_freq=0", *TASKS[task],
            *args.override]


WALL_KEYS = ("timing_s/step", "timing_s/testing", "timing_s/save_checkpoint")
"""What a run's wall time sums: its steps, validations and checkpoints, start-up (model loading) left
out. Validation counts because fully async generates while it runs (its first step then waits for
nothing); the validation set is the same in every mode."""


def curve(rows: list[dict[str, Any]], prompts_per_update: int, n: int) -> list[dict[str, float]]:
    """Each validation's score, pass@k, mean response length, trained prompts and wall time so far
    (`WALL_KEYS`). Trained prompts are a step's `training/responses` / n where logged (an update may
    train more or fewer than R groups: the lag cap's pacing, dynamic sampling), else
    `prompts_per_update` a step."""
    points, wall, prompts = [], 0.0, 0.0
    for row in rows:
        wall += sum(row.get(k, 0.0) for k in WALL_KEYS)
        if "timing_s/step" in row:
            prompts += row["training/responses"] / n if "training/responses" in row else prompts_per_update
        if "val/score/mean" in row:
            passes = [v for k, v in row.items() if "/pass@" in k]
            points.append({"samples": prompts, "wall_s": wall, "score": row["val/score/mean"],
                           "pass": statistics.fmean(passes) if passes else None,
                           "length": row.get("val/response_length/mean")})
    return points


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What every cell of a comparison shares; a cell is reused (skipped, summarised) only under the same."""
    return {"steps": args.steps, "batch": args.batch, "n": args.n, "lr": args.lr, "val_every": args.val_every,
            "val_size": args.val_size, "override": list(args.override)}


LEGACY_SETTINGS = {"steps": 60, "batch": 16, "n": 8, "lr": 2e-4, "val_every": 10, "val_size": 64, "override": []}
"""The settings of the cells written before cells recorded theirs (2026-11-26)."""


def same_settings(results: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The results run under `args`' settings."""
    return [r for r in results if r.get("settings", LEGACY_SETTINGS) == settings(args)]


def run_cell(mode: str, task: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One cell: its curve, speed, what it trained (`bench/cell_stats.py`: `partial_rollout`, the run's
    `partial_ratio` and `version_lag_max` from the sample ledger, the lengths' summary) and when it started."""
    out = fresh_dir(args.runs_dir, f"{mode}-{task}-{seed}")
    start = time.perf_counter()
    keys = overrides(mode, task, seed, args)
    cell = {"mode": mode, "task": task, "seed": seed, "settings": settings(args),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "partial_rollout": partial_rollout(keys)}
    try:
        launch(train_command(out, keys), out, args.timeout_s)
    except RunFailed as error:
        return {**cell, **failure(mode, error, out)}
    rows = metric_rows(out)
    points = curve(rows, args.batch, args.n)
    steps = [r for r in rows if "timing_s/step" in r]
    run = read_run(out)
    return {**cell, "points": points, "process_s": time.perf_counter() - start,
            "wall_s": points[-1]["wall_s"] if points else None,
            "samples_per_s": args.steps * args.batch * args.n / max(sum(r["timing_s/step"] for r in steps), 1e-9),
            "partial_ratio": run["ledger"]["partial_ratio"], "version_lag_max": run["ledger"]["version_lag_max"],
            "ledger": run["ledger"], "diagnostics": run["diagnostics"], "dir": str(out)}


def partial_rollout(keys: list[str]) -> bool:
    """Whether a cell's keys turn partial rollout on (the last setting of the key wins)."""
    values = [k.split("=", 1)[1].lower() for k in keys if k.startswith("async_training.partial_rollout=")]
    return bool(values) and values[-1] == "true"


EXPLORATORY = ("exploratory (issue 38): not pre-registered; \"not worse at 0.03\" is one-sided non-inferiority "
               "at an absolute margin, not equivalence (bench/study.py runs the pre-registered studies)")
"""The label of every summary and table of this module's cells."""


def parity(diffs: list[float], margin: float = MARGIN) -> dict[str, Any]:
    """The exploratory verdict on paired per-seed differences (mode - colocated final score): "not worse
    at 0.03" when the 95% t-interval lies above -margin (non-inferiority, not equivalence: the interval
    may reach far above +margin), "below" when it lies below it, else "not shown" (too few seeds, or
    an interval that straddles it); "not shown" also under 5 seeds, whatever the interval.

    Example: diffs [0.01, -0.01, 0.0, 0.02, -0.02] -> mean 0.0, half-width 2.776 x 0.0158 / sqrt(5)
    = 0.0196, interval [-0.0196, 0.0196]: "not worse at 0.03"."""
    n = len(diffs)
    if n < 2:
        return {"n": n, "verdict": "not shown"}
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = (T_975[n - 2] if n - 2 < len(T_975) else 1.96) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = (f"not worse at {margin:g}" if low > -margin and n >= 5 else "below" if high < -margin
               else "not shown")
    return {"n": n, "mean_diff": mean, "ci95": [low, high], "verdict": verdict}


def final_score(points: list[dict[str, float]], last: int = FINAL_POINTS) -> float:
    """A run's final score: the mean of its last `last` validations (the plateau), not the last one
    alone, whose sampling noise (64 prompts x 4 samples) would dominate a paired difference.

    Example: scores 0.2, 0.3, 0.35, 0.3, 0.31 -> (0.35 + 0.3 + 0.31) / 3 = 0.32."""
    return statistics.fmean(p["score"] for p in points[-last:])


def summarize(results: list[dict[str, Any]], last: int = FINAL_POINTS) -> dict[str, Any]:
    """Per task and mode: the mean curve with its spread, final scores (`final_score` of the last `last`
    validations), time to 90% of colocated's final score (`median_time` over seeds) and the parity verdict
    against colocated, paired by seed."""
    done = [r for r in results if "points" in r and r["points"]]
    out: dict[str, Any] = {}
    for task in sorted({r["task"] for r in done}):
        runs = {m: {r["seed"]: r for r in done if r["task"] == task and r["mode"] == m} for m in MODES}
        reference = {s: final_score(r["points"], last) for s, r in runs["colocated"].items()}
        target = 0.9 * statistics.fmean(reference.values()) if reference else None
        out[task] = {m: mode_summary(by_seed, reference, target, last) for m, by_seed in runs.items() if by_seed}
    return out


def mode_summary(by_seed: dict[int, dict[str, Any]], reference: dict[int, float],
                 target: float | None, last: int) -> dict[str, Any]:
    finals = {s: final_score(r["points"], last) for s, r in by_seed.items()}
    paired = [s for s in sorted(finals) if s in reference]
    reach = [first_wall(r["points"], target) for r in by_seed.values()] if target is not None else []
    return {"seeds": sorted(by_seed), "curve": mean_curve([r["points"] for r in by_seed.values()]),
            "final_mean": statistics.fmean(finals.values()), "final_min": min(finals.values()),
            "final_max": max(finals.values()),
            "reference_paired_mean": statistics.fmean(reference[s] for s in paired) if paired else None,
            "time_to_90pct_s": median_time(reach), "status": "exploratory",
            "parity": parity([finals[s] - reference[s] for s in paired]),
            "samples_per_s": statistics.fmean(r["samples_per_s"] for r in by_seed.values())}


def median_time(times: list[float | None]) -> float | None:
    """The median over seeds of the time to the target, a seed that never reached it counting as
    infinitely late: None when half the seeds or more never reached it.

    Example: [10, None, 30] -> 30; [10, None] -> None."""
    median = statistics.median(math.inf if t is None else t for t in times) if times else math.inf
    return None if math.isinf(median) else median


def first_wall(points: list[dict[str, float]], target: float) -> float | None:
    """Training wall time of the first validation at or above `target` (None: never)."""
    return next((p["wall_s"] for p in points if p["score"] >= target), None)


def mean_curve(curves: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Point by point over seeds (runs validate at the same sample counts): mean score, its range, mean wall time."""
    length = min(len(c) for c in curves)
    return [{"samples": curves[0][i]["samples"], "score": statistics.fmean(c[i]["score"] for c in curves),
             "score_min": min(c[i]["score"] for c in curves), "score_max": max(c[i]["score"] for c in curves),
             "wall_s": statistics.fmean(c[i]["wall_s"] for c in curves)} for i in range(length)]


def plot(summary: dict[str, Any], img_dir: Path) -> list[Path]:
    """docs/img/convergence_<task>.png: score vs trained prompts and vs training wall time, each mode's
    mean over seeds with its min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for task, modes in summary.items():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for mode, s in modes.items():
            c = s["curve"]
            for ax, x in zip(axes, ("samples", "wall_s")):
                xs = [p[x] for p in c]
                ax.plot(xs, [p["score"] for p in c], label=mode, lw=2 if mode == "colocated" else 1)
                ax.fill_between(xs, [p["score_min"] for p in c], [p["score_max"] for p in c], alpha=0.12)
        axes[0].set(xlabel="trained prompts", ylabel="validation score", title=f"{task}: score vs samples")
        axes[1].set(xlabel="training wall time (s)", title=f"{task}: score vs time")
        axes[1].legend(fontsize=7)
        img_dir.mkdir(parents=True, exist_ok=True)
        path = img_dir / f"convergence_{task}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def table(summary: dict[str, Any]) -> str:
    """The markdown table of docs/benchmarks.md: one row per task and mode. "colocated, same seeds" is
    colocated's final score over the mode's seeds, so final - that = the paired mean difference."""
    lines = [f"_{EXPLORATORY}_", "", "| task | mode | seeds | final score (min-max) | colocated, same seeds "
             "| vs colocated, 95% CI | verdict | time to 90% | samples/s |", "|---|---|---|---|---|---|---|---|---|"]
    for task, modes in summary.items():
        for mode, s in modes.items():
            p = s["parity"]
            ci = f"{p['mean_diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]" if "ci95" in p else "-"
            reach = f"{s['time_to_90pct_s']:.0f} s" if s["time_to_90pct_s"] is not None else "not reached"
            same = f"{s['reference_paired_mean']:.3f}" if s.get("reference_paired_mean") is not None else "-"
            lines.append(f"| {task} | {mode} | {len(s['seeds'])} | {s['final_mean']:.3f} ({s['final_min']:.3f}-"
                         f"{s['final_max']:.3f}) | {same if mode != 'colocated' else '-'} | "
                         f"{ci if mode != 'colocated' else 'reference'} | "
                         f"{p['verdict'] if mode != 'colocated' else '-'} | {reach} | {s['samples_per_s']:.1f} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of MODES")
    ap.add_argument("--tasks", default="arithmetic,countdown,longtail",
                    help="comma list of TASKS (smollm2_addition only when named: its settings are its own)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    ap.add_argument("--steps", type=int, default=60, help="updates per run (fully async: steps x batch prompts)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per update")
    ap.add_argument("--n", type=int, default=8, help="responses per prompt")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--val-every", type=int, default=10, help="validate every this many updates' prompts")
    ap.add_argument("--val-size", type=int, default=64)
    ap.add_argument("--final-points", type=int, default=FINAL_POINTS,
                    help="validations a run's final score averages (the plateau's; a summary setting, not a cell's)")
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--cell-s", type=float, help="expected seconds per cell (default: the mean of those done)")
    ap.add_argument("--override", action="append", default=[], help="KEY=VALUE for every cell")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/asyncrl-convergence"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/convergence.jsonl"))
    ap.add_argument("--summary", type=Path, default=Path("bench/results/convergence_summary.json"))
    ap.add_argument("--img-dir", type=Path, default=Path("docs/img"))
    ap.add_argument("--report", action="store_true", help="only summarise --out")
    args = ap.parse_args(argv)
    args.modes, args.tasks = args.modes.split(","), args.tasks.split(",")
    if unknown := [m for m in args.modes if m not in MODES]:
        ap.error(f"--modes: no such mode {', '.join(unknown)}; the modes are {', '.join(MODES)}")
    if unknown := [t for t in args.tasks if t not in TASKS]:
        ap.error(f"--tasks: no such task {', '.join(unknown)}; the tasks are {', '.join(TASKS)}")
    return args


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report(args: argparse.Namespace) -> None:
    summary = summarize(same_settings(load(args.out), args), args.final_points)
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    try:
        for path in plot(summary, args.img_dir):
            print(f"wrote {path}")
    except ImportError:
        print("no plots: matplotlib is missing (pip install 'asyncrl[bench]')")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if not args.report:
        done = same_settings(load(args.out), args)
        finished = {(r["mode"], r["task"], r["seed"]) for r in done if "points" in r}
        cells = [(m, t, s) for s in range(args.seeds) for t in args.tasks for m in args.modes
                 if (m, t, s) not in finished]
        cell_s = args.cell_s or (statistics.fmean(r["process_s"] for r in done if "process_s" in r)
                                 if any("process_s" in r for r in done) else 60.0)
        print(f"{len(cells)} cells to run ({len(finished)} done): about {len(cells) * cell_s / 3600:.1f} h "
              f"at {cell_s:.0f} s a cell", flush=True)
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for mode, task, seed in cells:
            result = run_cell(mode, task, seed, args)
            with args.out.open("a") as f:  # each cell as it finishes: a bench cut short keeps them
                f.write(json.dumps(result) + "\n")
            final = final_score(result["points"], args.final_points) if result.get("points") else result.get("error")
            print(f"{mode} {task} seed {seed}: final {final}, {result.get('process_s', 0):.0f} s", flush=True)
    report(args)


if __name__ == "__main__":
    main()
