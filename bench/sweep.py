"""The learning-rate sweep of a pre-registered study (issue 38, deliverable 3): the `lr_sweep` cells of
`bench/protocols/<study>.yaml`, validated on a tuning split apart from the test split, and the pick.

    PYTHONPATH=. python bench/sweep.py bench/protocols/partial_rollout.yaml            # run what is missing
    PYTHONPATH=. python bench/sweep.py bench/protocols/partial_rollout.yaml --report   # the table and the pick

The sweep runs every `lr_sweep.arms` arm at every `lr_sweep.values` learning rate on every
`lr_sweep.seeds` seed (arms alternating within a seed and a rate), each cell validated on
`lr_sweep.tuning_split.size` prompts of the task drawn as the split named `tune` with
`tuning_split.seed` (`data.val_files`, a JSONL file written once per study), so that the test split
the main cells report on chooses nothing. The endpoint is the protocol's (same score, same window).
The pick follows `lr_sweep.rule`: the rate whose colocated cells have the highest mean endpoint; it is
written into the protocol with `python bench/protocol.py set-lr` and committed before the main cells.
An arm the main cells find "worse" that `lr_sweep.arms` does not name is swept the same way afterwards
(`bench/study.py` runs it), so that the rule's secondary analysis can rerun it at its own best rate.
A sweep cell records the protocol's hash without `lr` (`bench/protocol.py`'s `stamp`), so it keeps
counting after that commit; cells go to `bench/results/study_<study>_sweep.jsonl` as each finishes, and
a rerun skips those recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdicts  # noqa: E402
from bench.convergence import TASKS, load, run_cell  # noqa: E402
from bench.protocol import Protocol, check_model, ready, refusal, stamp  # noqa: E402
from bench.protocol import load as load_protocol  # noqa: E402
from bench.study import RESULTS, cell_args  # noqa: E402

SPLIT = "tune"
"""The name the tuning prompts are drawn under (a task's generator is seeded by task, split and seed)."""


def sweep_cells(protocol: Protocol, arms: list[str] | None = None) -> list[tuple[str, float, int]]:
    """(arm, lr, seed) of every sweep cell of `arms` (the protocol's `lr_sweep.arms`, or those the secondary
    analysis sweeps): seed by seed, rate by rate, the arms alternating."""
    sweep = protocol.body["lr_sweep"]
    arms = sweep["arms"] if arms is None else arms
    return [(arm, float(lr), seed) for seed in sweep["seeds"] for lr in sweep["values"] for arm in arms]


def tuning_file(protocol: Protocol, runs_dir: Path) -> Path:
    """The tuning split as a verl-layout JSONL file under `runs_dir` (written when missing)."""
    from asyncrl.config.load import load_config
    from asyncrl.data.dataset import write_jsonl
    from asyncrl.data.tasks import task_rows

    split, task = protocol.body["lr_sweep"]["tuning_split"], protocol.body["task"]
    path = runs_dir / f"{protocol.body['study']}-{SPLIT}-{split['seed']}-{split['size']}.jsonl"
    if not path.exists():
        cfg = load_config(None, [*TASKS[task["name"]], *task.get("keys", [])])
        runs_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl(task_rows(cfg.data, split["size"], seed=split["seed"], split=SPLIT), str(path))
    return path


def run(protocol: Protocol, out: Path, runs_dir: Path, timeout_s: float, arms: list[str] | None = None,
        part: tuple[int, int] = (0, 1)) -> None:
    """Run the sweep cells of `arms` (`sweep_cells`) not yet recorded; of shard `part` (every K-th from the I-th)."""
    if problems := ready(protocol, sweep=True) or check_model(protocol):
        raise SystemExit("\n".join(problems))
    done = {(c["arm"], c["lr"], c["seed"]) for c in load(out) if refusal(c, protocol, sweep=True) is None}
    todo = [c for i, c in enumerate(sweep_cells(protocol, arms)) if c not in done and i % part[1] == part[0]]
    print(f"{protocol.body['study']} sweep of {', '.join(arms or protocol.body['lr_sweep']['arms'])}: "
          f"{len(todo)} cells to run, {len(done)} done", flush=True)
    val = tuning_file(protocol, runs_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    for arm, lr, seed in todo:
        args = cell_args(protocol, arm, runs_dir, timeout_s, lr=lr)
        args.override.append(f"data.val_files=[{val}]")
        cell = run_cell(protocol.arm(arm)["mode"], protocol.body["task"]["name"], seed, args)
        cell = {"arm": arm, "lr": lr, **stamp(protocol, sweep=True), **cell}
        with out.open("a") as f:
            f.write(json.dumps(cell) + "\n")
        why = refusal(cell, protocol, sweep=True) or "admitted"
        print(f"{arm} lr {lr:g} seed {seed}: {why}, {cell.get('process_s', 0):.0f} s", flush=True)


def sweep_table(protocol: Protocol, out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The table of the sweep cells recorded in `out` (`summarize`): arm -> rate -> seeds, mean endpoint, sd."""
    return summarize(protocol, load(out))["table"]


def own_best(protocol: Protocol, rows: dict[str, dict[str, Any]]) -> float | None:
    """An arm's best rate in its sweep rows (rate -> seeds, mean endpoint); None until every rate of
    `lr_sweep.values` has every seed of `lr_sweep.seeds`."""
    sweep = protocol.body["lr_sweep"]
    rates = [f"{float(lr):g}" for lr in sweep["values"]]
    if any(rows.get(lr, {}).get("seeds") != len(sweep["seeds"]) for lr in rates):
        return None
    return float(max(rates, key=lambda lr: rows[lr]["mean"]))


def summarize(protocol: Protocol, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm and rate: the seeds recorded and their mean endpoint; the pick once colocated's cells
    are complete at every rate (None before)."""
    window = tuple(protocol.body["endpoint"]["window_prompts"])
    admitted = [c for c in results if refusal(c, protocol, sweep=True) is None]
    table: dict[str, dict[str, Any]] = {}
    swept = protocol.body["lr_sweep"]["arms"]
    secondary = sorted({c["arm"] for c in admitted} - set(swept))  # swept later, for the secondary analysis
    for arm, lr, _ in sweep_cells(protocol, [*swept, *secondary]):
        ends = [verdicts.endpoint(c["points"], window) for c in admitted if c["arm"] == arm and c["lr"] == lr]
        table.setdefault(arm, {})[f"{lr:g}"] = {
            "seeds": len(ends), "mean": statistics.fmean(ends) if ends else None,
            "sd": statistics.stdev(ends) if len(ends) > 1 else None}
    seeds = len(protocol.body["lr_sweep"]["seeds"])
    colocated = table.get("colocated", {})
    complete = colocated and all(row["seeds"] == seeds for row in colocated.values())
    pick = max(colocated, key=lambda lr: colocated[lr]["mean"]) if complete else None
    return {"study": protocol.body["study"], "split": protocol.body["lr_sweep"]["tuning_split"],
            "admitted": len(admitted), "refused": len(results) - len(admitted), "table": table, "pick": pick}


def report(summary: dict[str, Any], path: Path) -> str:
    lines = [f"{summary['study']} sweep ({summary['admitted']} cells admitted, {summary['refused']} refused): "
             "mean endpoint on the tuning split [seeds]"]
    for arm, rows in summary["table"].items():
        cells = ", ".join(f"{lr}: {r['mean']:.3f} [{r['seeds']}]" if r["mean"] is not None else f"{lr}: -"
                          for lr, r in rows.items())
        lines.append(f"  {arm}: {cells}")
    lines.append(f"pick: lr {summary['pick']}: python bench/protocol.py set-lr {path} --lr {summary['pick']}"
                 if summary["pick"] else "pick: none yet (colocated's cells are not complete at every rate)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("protocol", type=Path)
    ap.add_argument("--report", action="store_true", help="only summarise the recorded cells")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/asyncrl-study"))
    ap.add_argument("--timeout-s", type=float, default=1800)
    args = ap.parse_args(argv)
    protocol = load_protocol(args.protocol)
    out = RESULTS / f"study_{protocol.body['study']}_sweep.jsonl"
    if not args.report:
        run(protocol, out, args.runs_dir, args.timeout_s)
    summary = summarize(protocol, load(out))
    out.with_name(f"study_{protocol.body['study']}_sweep_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(report(summary, args.protocol))


if __name__ == "__main__":
    main()
