"""Benchmark (issue 38's bias checks): the per-sample staleness cap's two policies on the long-tail task.

Fully async at `async_training.staleness_threshold=2` (so a group can reach version lag 2 or more)
with `async_training.max_version_lag=1`, the cap held by dropping late groups (`drop`: regenerated)
or by pacing the trainer (`pace`, the default), each with and without partial rollout, against
colocated on the same seeds; tiny-longtail (`bench/convergence.py`'s `longtail` task), 60 updates of
16 prompts x 8, lr 2e-4, validation on 128 test prompts x 4 every 10 updates. Exploratory: not
pre-registered, no verdict; it measures what dropping removes and what it costs.

Per arm (mean over seeds): the groups dropped and the dropped responses' mean length (run totals:
`fully_async/count/dropped_stale`, `fully_async/dropped/response_length_mean`), the trained
responses' mean and 90th-percentile length and KS distance against colocated's (the sample ledger),
the version lag, the cell's process time (arms alternate: comparable within a run), and the
endpoint (the mean of a run's validations over its last third of trained prompts, `WINDOW`: pacing
trains some updates on 2R groups, so a paced run validates at other prompt counts than colocated)
with its paired difference from colocated.

    PYTHONPATH=. python bench/lag_cap.py                 # 5 arms x 3 seeds, ~1-2 min a cell on 2 cores
    PYTHONPATH=. python bench/lag_cap.py --report        # the summary only

Each cell is appended to bench/results/lag_cap.jsonl as it finishes (a rerun skips the recorded
ones); the summary goes to bench/results/lag_cap_summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cell_stats import ks_distance  # noqa: E402
from bench.convergence import load, run_cell  # noqa: E402
from bench.verdicts import endpoint  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CAP = ["async_training.staleness_threshold=2", "async_training.max_version_lag=1"]
SHARED = ["num_threads=1"]
"""One torch thread a cell: two threads against another job on 2 cores spin in their barriers (x10-100 slower)."""
ARMS: dict[str, tuple[str, list[str]]] = {
    "colocated": ("colocated", []),
    "drop": ("fa_stale", [*CAP, "async_training.version_lag_policy=drop"]),
    "pace": ("fa_stale", [*CAP, "async_training.version_lag_policy=pace"]),
    "drop_partial": ("fa_partial", [*CAP, "async_training.version_lag_policy=drop"]),
    "pace_partial": ("fa_partial", [*CAP, "async_training.version_lag_policy=pace"]),
}
"""Arm -> (bench/convergence.py mode, its extra keys: after the mode's, so they win)."""
SETTINGS = {"steps": 60, "batch": 16, "n": 8, "lr": 2e-4, "val_every": 10, "val_size": 128}
WINDOW = (640, 960)
"""The endpoint's window of trained prompts: the last third of a run's 960."""


def cell_args(arm: str, runs_dir: Path, timeout_s: float) -> argparse.Namespace:
    return argparse.Namespace(**SETTINGS, runs_dir=runs_dir, timeout_s=timeout_s, override=[*SHARED, *ARMS[arm][1]])


def run(seeds: int, out: Path, runs_dir: Path, timeout_s: float) -> None:
    done = {(c["arm"], c["seed"]) for c in load(out) if "points" in c}
    todo = [(arm, s) for s in range(seeds) for arm in ARMS if (arm, s) not in done]
    print(f"lag_cap: {len(todo)} cells to run, {len(done)} done", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    for arm, seed in todo:
        cell = {"arm": arm, **run_cell(ARMS[arm][0], "longtail", seed, cell_args(arm, runs_dir, timeout_s))}
        with out.open("a") as f:
            f.write(json.dumps(cell) + "\n")
        print(f"{arm} seed {seed}: {cell.get('error', 'done')}, {cell.get('process_s', 0):.0f} s", flush=True)


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [c for c in cells if "points" in c]
    base = {c["seed"]: c for c in ok if c["arm"] == "colocated"}
    out: dict[str, Any] = {"settings": SETTINGS, "window_prompts": WINDOW, "arms": {},
                           "label": "exploratory (issue 38 bias checks): not pre-registered"}
    for arm in ARMS:
        mine = [c for c in ok if c["arm"] == arm]
        if not mine:
            continue
        diffs = [endpoint(c["points"], WINDOW) - endpoint(base[c["seed"]]["points"], WINDOW)
                 for c in mine if c["seed"] in base]
        row: dict[str, Any] = {
            "seeds": sorted(c["seed"] for c in mine),
            "endpoint": statistics.fmean(endpoint(c["points"], WINDOW) for c in mine),
            "diff_vs_colocated": statistics.fmean(diffs) if diffs else None,
            "diff_sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
            "trained_length_mean": statistics.fmean(c["ledger"]["length_mean"] for c in mine),
            "trained_length_p90": statistics.fmean(c["ledger"]["length_p90"] for c in mine),
            "version_lag_max": max(c["ledger"]["version_lag_max"] for c in mine),
            "partial_ratio": statistics.fmean(c["ledger"]["partial_ratio"] for c in mine),
            "dropped_groups": statistics.fmean(c["diagnostics"].get("fully_async/count/dropped_stale", 0.0)
                                               for c in mine),
            "process_s": statistics.fmean(c["process_s"] for c in mine)}
        dropped = [c["diagnostics"]["fully_async/dropped/response_length_mean"] for c in mine
                   if c["diagnostics"].get("fully_async/count/dropped_stale", 0) > 0]
        row["dropped_length_mean"] = statistics.fmean(dropped) if dropped else None
        ks = [ks_distance(c["ledger"]["length_hist_by_lag"], base[c["seed"]]["ledger"]["length_hist_by_lag"])
              for c in mine if c["seed"] in base]
        row["ks_vs_colocated"] = statistics.fmean(ks) if ks else None
        out["arms"][arm] = row
    return out


def table(summary: dict[str, Any]) -> str:
    lines = ["| arm | seeds | endpoint | vs colocated (sd) | trained length mean / p90 | KS vs colocated | lag max | "
             "partial ratio | groups dropped | dropped length mean | cell s |", "|---" * 11 + "|"]
    for arm, r in summary["arms"].items():
        diff = "-" if r["diff_vs_colocated"] is None or arm == "colocated" else \
            f"{r['diff_vs_colocated']:+.3f} ({r['diff_sd']:.3f})" if r["diff_sd"] is not None else \
            f"{r['diff_vs_colocated']:+.3f}"
        ks = "-" if r["ks_vs_colocated"] is None or arm == "colocated" else f"{r['ks_vs_colocated']:.3f}"
        dropped_len = "-" if r["dropped_length_mean"] is None else f"{r['dropped_length_mean']:.1f}"
        lines.append(f"| {arm} | {len(r['seeds'])} | {r['endpoint']:.3f} | {diff} | {r['trained_length_mean']:.1f} / "
                     f"{r['trained_length_p90']:.0f} | {ks} | {r['version_lag_max']} | {r['partial_ratio']:.2f} | "
                     f"{r['dropped_groups']:.1f} | {dropped_len} | {r['process_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--report", action="store_true", help="only summarise the recorded cells")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/asyncrl-lag-cap"))
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=RESULTS / "lag_cap.jsonl")
    args = ap.parse_args(argv)
    if not args.report:
        run(args.seeds, args.out, args.runs_dir, args.timeout_s)
    summary = summarize(load(args.out))
    args.out.with_name(args.out.stem + "_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))


if __name__ == "__main__":
    main()
