"""Benchmark: does the tiny-tools model learn to use the calculator? The tool task (issue 28) in
colocated and fully async, 3 seeds, against the same model without the tool.

Each (mode, seed) cell is one `asyncrl train` process in a fresh directory (`bench/pipelines.py`'s
`launch`) on `data.task=long_addition` with `model.path=tiny-tools` and multi-turn episodes in
the compact call syntax (`rollout.multi_turn.enable=true rollout.multi_turn.format=compact`). It
validates before training (the tool-enabled accuracy after the warm-up) and every `--val-every`
updates' prompts, sampled at temperature 1 (`rollout.val_n` responses a prompt). The baseline
cell is `asyncrl eval` of the same warmed model with multi-turn off: its tool calls go unanswered,
so it scores only what it adds by itself. A finished cell appends one line to `--out` (JSONL) at
once; a rerun skips the cells already there.

Targets (issue 28): in each mode the median over seeds of (final - initial) validation accuracy
is >= 0.15, and the median final accuracy is >= 0.30 above the no-tool baseline.

    PYTHONPATH=. python bench/tool_task.py                     # baseline + 2 modes x 3 seeds
    PYTHONPATH=. python bench/tool_task.py --modes colocated --seeds 1 --steps 10
    PYTHONPATH=. python bench/tool_task.py --report            # the summary from --out
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pipelines import ROOT, RunFailed, failure, fresh_dir, launch, train_command  # noqa: E402

TASK = ["model.path=tiny-tools", "data.task=long_addition", "data.max_prompt_length=80",
        "data.max_response_length=96"]
TOOLS = ["rollout.multi_turn.enable=true", "rollout.multi_turn.format=compact",
         "rollout.multi_turn.max_assistant_turns=2"]
MODES: dict[str, list[str]] = {
    "colocated": ["pipeline=colocated"],
    "fully_async": ["pipeline=fully_async", "async_training.require_batches=1",
                    "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true"],
}
"""Mode -> its keys (fully async: one update per version, staleness 0.5, partial rollout)."""
RISE, OVER_NO_TOOL = 0.15, 0.30
"""The issue's targets: accuracy gained during RL, and the final accuracy over the no-tool baseline."""


def overrides(mode: str, seed: int, args: argparse.Namespace) -> list[str]:
    """One cell's keys: the task's, the tools', the mode's, then what every cell shares."""
    length = ([f"rollout.total_rollout_steps={args.steps * args.batch}", f"rollout.test_freq={args.val_every}"]
              if mode == "fully_async" else
              [f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.val_every}"])
    return [*TASK, *TOOLS, *MODES[mode], *length, f"seed={seed}", f"data.train_batch_size={args.batch}",
            f"actor.ppo_mini_batch_size={args.batch}", f"rollout.n={args.n}", f"actor.lr={args.lr}",
            f"data.val_size={args.val_size}", f"rollout.val_n={args.val_n}", "trainer.val_before_train=true",
            "trainer.logger=[jsonl]", "trainer.resume_mode=disable", "trainer.save_freq=0", *args.override]


def validations(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each validation's accuracy, with the updates and training wall time before it."""
    points, wall, updates = [], 0.0, 0
    for row in rows:
        wall += row.get("timing_s/step", 0.0) + row.get("timing_s/testing", 0.0)
        updates += "timing_s/step" in row
        if "val/score/mean" in row:
            points.append({"updates": updates, "wall_s": wall, "accuracy": row["val/score/mean"]})
    return points


def run_cell(mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = fresh_dir(args.runs_dir, f"{mode}-{seed}")
    start = time.perf_counter()
    try:
        launch(train_command(out, overrides(mode, seed, args)), out, args.timeout_s)
    except RunFailed as error:
        return {"mode": mode, "seed": seed, **failure(mode, error, out)}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    points = validations(rows)
    steps = [r for r in rows if "timing_s/step" in r]
    tools = {k: statistics.fmean(r[k] for r in steps if k in r) for k in ("tool_calls/mean", "num_turns/mean")
             if any(k in r for r in steps)}
    return {"mode": mode, "seed": seed, "points": points, "initial": points[0]["accuracy"] if points else None,
            "final": points[-1]["accuracy"] if points else None, "process_s": time.perf_counter() - start,
            "train_reward_first": steps[0].get("critic/score/mean") if steps else None,
            "train_reward_last": steps[-1].get("critic/score/mean") if steps else None, **tools, "dir": str(out)}


def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The warmed model without the tool: `asyncrl eval` with multi-turn off, on the same test prompts."""
    out = fresh_dir(args.runs_dir, "no_tool")
    report = out / "eval.json"
    cmd = [sys.executable, "-m", "asyncrl.cli", "eval", "--out", str(report), *TASK, "seed=0",
           f"data.val_size={args.val_size}", f"rollout.val_n={args.val_n}", *args.override]
    try:
        launch(cmd, out, args.timeout_s)
    except RunFailed as error:
        return {"mode": "no_tool", "seed": 0, **failure("no_tool", error, out)}
    metrics = json.loads(report.read_text())["metrics"]
    return {"mode": "no_tool", "seed": 0, "final": metrics["val/score/mean"], "dir": str(out)}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: medians over seeds of the initial and final accuracy and of the rise, and the
    verdicts against the targets (the no-tool baseline from its cell)."""
    base = next((r["final"] for r in results if r["mode"] == "no_tool" and "final" in r), None)
    out: dict[str, Any] = {"no_tool_accuracy": base}
    for mode in MODES:
        done = [r for r in results if r["mode"] == mode and r.get("final") is not None]
        if not done:
            continue
        rise = statistics.median(r["final"] - r["initial"] for r in done)
        final = statistics.median(r["final"] for r in done)
        out[mode] = {"seeds": sorted(r["seed"] for r in done), "initial": statistics.median(r["initial"] for r in done),
                     "final": final, "rise": rise, "rise_met": rise >= RISE,
                     "over_no_tool": None if base is None else final - base,
                     "over_no_tool_met": None if base is None else final - base >= OVER_NO_TOOL}
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of MODES")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    ap.add_argument("--steps", type=int, default=20, help="updates per run (fully async: steps x batch prompts)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per update")
    ap.add_argument("--n", type=int, default=8, help="responses per prompt")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--val-every", type=int, default=10, help="validate every this many updates")
    ap.add_argument("--val-size", type=int, default=64)
    ap.add_argument("--val-n", type=int, default=4)
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--override", action="append", default=[], help="KEY=VALUE for every cell")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/asyncrl-tool-task"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/tool_task.jsonl")
    ap.add_argument("--summary", type=Path, default=ROOT / "bench/results/tool_task.json")
    ap.add_argument("--report", action="store_true", help="only summarize --out")
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    done = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    if not args.report:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        have = {(r["mode"], r["seed"]) for r in done if "error" not in r}
        cells = [("no_tool", 0)] + [(m, s) for s in range(args.seeds) for m in args.modes.split(",")]
        for mode, seed in cells:
            if (mode, seed) in have:
                continue
            print(f"tool task: {mode} seed {seed}", flush=True)
            result = run_baseline(args) if mode == "no_tool" else run_cell(mode, seed, args)
            with args.out.open("a") as f:
                f.write(json.dumps(result) + "\n")
            done.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "points"}), flush=True)
    summary = summarize(done)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
