"""Run and summarise a pre-registered accuracy study (issue 38): the cells of `bench/protocols/<study>.yaml`
and the verdicts as that protocol defines them.

    PYTHONPATH=. python bench/study.py bench/protocols/longtail_plateau.yaml --plan     # cells, hours, readiness
    PYTHONPATH=. python bench/study.py bench/protocols/longtail_plateau.yaml            # run what is missing
    PYTHONPATH=. python bench/study.py bench/protocols/longtail_plateau.yaml --shard 1/2  # the other half, beside it
    PYTHONPATH=. python bench/study.py bench/protocols/longtail_plateau.yaml --report   # the summary only

A run refuses to start unless the protocol is committed, its model pinned and matching this machine's,
and its lr set (`bench/protocol.py`). Cells run arm after arm within a seed, seeds in order; each is
appended to `bench/results/study_<study>.jsonl` as it finishes, with `protocol_hash`,
`protocol_commit` and `started_at`, and a rerun skips the cells already recorded under the same
protocol, so a study can stop and go on later; `--shard I/K` lets K processes share the cells. The
summary counts only the cells the protocol admits (`protocol.refusal`: others are listed with the
reason) and reports, per arm, the verdict of `bench/verdicts.py` at the look it came (an arm conclusive
at an interim look stops there, and the runner runs no more of its cells), the margin, colocated's
slope over the endpoint window, the control's interval, what was trained (partial ratio, version lag,
trained and validation lengths against colocated's), and the secondary analysis the protocol's
`lr_sweep.rule` names (an arm found "worse" rerun at its own best rate of the sweep; an arm the sweep
did not cover is swept first, `bench/sweep.py`), which the runner runs once the verdicts call for it.
Not here: the exploratory matrix (`bench/convergence.py`), whose cells never count for a study.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import verdicts  # noqa: E402
from bench.cell_stats import ks_distance, pooled  # noqa: E402
from bench.convergence import curve, load, mean_curve, run_cell  # noqa: E402
from bench.pipelines import metric_rows  # noqa: E402
from bench.protocol import Protocol, check_model, ready, refusal, stamp  # noqa: E402
from bench.protocol import load as load_protocol  # noqa: E402
from bench.study_plot import plot  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
"""Where a study's cells (`study_<study>.jsonl`) and summary (`study_<study>_summary.json`) go."""
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
"""Where a study's figure goes (`bench/study_plot.py`)."""


def cells(protocol: Protocol) -> list[tuple[str, int]]:
    """(arm, seed) of every main cell, arms alternating within a seed."""
    return [(a["name"], s) for s in range(protocol.body["seeds"]) for a in protocol.body["arms"]]


def cell_args(protocol: Protocol, arm: str, runs_dir: Path, timeout_s: float,
              lr: float | None = None) -> argparse.Namespace:
    """bench/convergence.py's arguments for one arm's cells: the protocol's settings and lr (`lr`: the
    sweep's), then the task's extra keys and the arm's (after the shared ones, so an arm's key wins)."""
    body, spec = protocol.body, protocol.arm(arm)
    lr = lr if lr is not None else spec.get("lr", body["lr"])
    return argparse.Namespace(**body["settings"], lr=lr, runs_dir=runs_dir, timeout_s=timeout_s,
                              override=[*body["task"].get("keys", []), *spec.get("keys", []), f"actor.lr={lr}"])


def shard(text: str) -> tuple[int, int]:
    """`--shard I/K` as (I, K)."""
    i, _, k = text.partition("/")
    if not (i.isdigit() and k.isdigit() and int(i) < int(k)):
        raise argparse.ArgumentTypeError(f"{text!r}: write I/K with 0 <= I < K, e.g. --shard 0/2 and --shard 1/2")
    return int(i), int(k)


def run(protocol: Protocol, out: Path, runs_dir: Path, timeout_s: float, part: tuple[int, int] = (0, 1)) -> None:
    """Run the cells not yet recorded (of shard `part`: every K-th cell from the I-th, in `cells` order),
    but none of an arm that needs no more (`settled`: another process's cells count too); then those of
    the secondary analysis, once the verdicts call for it (`secondary_cells`)."""
    if problems := ready(protocol) or check_model(protocol):
        raise SystemExit("\n".join(problems))
    done = {(c["arm"], c["seed"]) for c in load(out) if refusal(c, protocol) is None}
    todo = [c for i, c in enumerate(cells(protocol)) if c not in done and i % part[1] == part[0]]
    print(f"{protocol.body['study']}: {len(todo)} cells to run, {len(done)} done", flush=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    for arm, seed in todo:
        if arm in settled(protocol, load(out)):
            print(f"{arm} seed {seed}: not run, the arm's verdict is in", flush=True)
            continue
        record(protocol, out, {"arm": arm}, seed, cell_args(protocol, arm, runs_dir, timeout_s))
    if "lr_sweep" not in protocol.body:
        return
    from bench import sweep  # bench/sweep.py imports this module

    sweep_out = out.with_name(f"{out.stem}_sweep.jsonl")
    if arms := secondary_sweep_arms(protocol, summarize(protocol, load(out))):
        sweep.run(protocol, sweep_out, runs_dir, timeout_s, arms=arms, part=part)
        deadline = time.monotonic() + timeout_s  # another shard's last sweep cells

        def swept() -> bool:
            table = sweep.sweep_table(protocol, sweep_out)
            return all(sweep.own_best(protocol, table.get(arm, {})) is not None for arm in arms)

        while not swept() and time.monotonic() < deadline:
            time.sleep(30)
    extra = secondary_cells(protocol, summarize(protocol, load(out)), sweep.sweep_table(protocol, sweep_out))
    for name, arm, lr, seed in extra[part[0]::part[1]]:
        if (name, seed) not in {(c["arm"], c["seed"]) for c in load(out) if refusal(c, protocol) is None}:
            head = {"arm": name, "secondary_of": arm, "lr": lr}
            record(protocol, out, head, seed, cell_args(protocol, arm, runs_dir, timeout_s, lr=lr))


def record(protocol: Protocol, out: Path, head: dict[str, Any], seed: int, args: argparse.Namespace) -> None:
    """Run one cell of arm `head["arm"]` (or of the arm it is a secondary analysis of) and append it."""
    arm = head.get("secondary_of", head["arm"])
    cell = run_cell(protocol.arm(arm)["mode"], protocol.body["task"]["name"], seed, args)
    cell = {**head, **stamp(protocol), **cell}
    with out.open("a") as f:
        f.write(json.dumps(cell) + "\n")
    why = refusal(cell, protocol) or "admitted"
    print(f"{head['arm']} seed {seed}: {why}, {cell.get('process_s', 0):.0f} s", flush=True)


def worse(summary: dict[str, Any]) -> list[str]:
    """The arms whose verdict is "worse" (at the look it came, not still open)."""
    if summary["look"] is None:
        return []
    return [arm for arm, v in summary["arms"].items() if v["verdict"] == "worse" and arm not in summary["look"]["open"]]


def secondary_sweep_arms(protocol: Protocol, summary: dict[str, Any]) -> list[str]:
    """The arms found "worse" that the sweep did not cover: the secondary analysis sweeps them first."""
    return [arm for arm in worse(summary) if arm not in protocol.body["lr_sweep"]["arms"]]


def secondary_cells(protocol: Protocol, summary: dict[str, Any],
                    table: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, float, int]]:
    """The secondary analysis `lr_sweep.rule` names: an arm whose verdict is "worse" reruns at its own
    best rate of the sweep (`table`: arm -> rate -> seeds, mean endpoint; an arm outside `lr_sweep.arms`
    once its own sweep is complete), on the seeds of that verdict, where that rate is not the protocol's.
    (name, arm, lr, seed) of each cell, the name `<arm>@<lr>`."""
    from bench.sweep import own_best  # bench/sweep.py imports this module

    out = []
    for arm in worse(summary):
        best = own_best(protocol, table.get(arm, {}))
        if best is not None and best != protocol.body["lr"]:
            out += [(f"{arm}@{best:g}", arm, best, seed) for seed in range(summary["arms"][arm]["look"])]
    return out


def summarize(protocol: Protocol, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The study's summary from the recorded cells (see the module docstring)."""
    body = protocol.body
    refused = [{"arm": c.get("arm"), "seed": c.get("seed"), "why": why} for c in results
               if (why := refusal(c, protocol)) is not None]
    admitted = [c for c in results if refusal(c, protocol) is None]
    window = (body["endpoint"]["window_prompts"][0], body["endpoint"]["window_prompts"][1])
    runs = by_arm(protocol, admitted)
    finals = {arm: {s: verdicts.endpoint(c["points"], window) for s, c in by_seed.items()}
              for arm, by_seed in runs.items()}
    out: dict[str, Any] = {"study": body["study"], "protocol_hash": protocol.hash, "protocol_commit": protocol.commit,
                           "admitted": len(admitted), "refused": refused}
    look, arms = sequential_verdicts(protocol, runs, finals, window)
    if look is None:
        return {**out, "look": None, "verdicts": "none yet: no look reached (test.looks)"}
    colocated = [runs["colocated"][s]["points"] for s in range(look["seeds"])]
    seeds_of = {"colocated": range(look["seeds"]), **{arm: range(v["look"]) for arm, v in arms.items()}}
    out.update(look=look, margin=look.pop("margin"), plateau=verdicts.plateau_slope(colocated, window), arms=arms,
               trained=trained(runs, seeds_of, window))
    out["secondary"] = secondary_verdicts(protocol, admitted, finals["colocated"], arms, window)
    control = arms[body["control"]]
    if "ci_two_sided" in control:
        low, high = control["ci_two_sided"]
        out["control"] = {"ci_two_sided": control["ci_two_sided"], "level": 1 - look["alpha"],
                          "contains_0": low <= 0.0 <= high, "no_wider_than_margin": high - low <= control["margin"]}
    return out


def by_arm(protocol: Protocol, admitted: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """The admitted cells of each of the protocol's arms, by seed."""
    return {a["name"]: {c["seed"]: c for c in admitted if c.get("arm") == a["name"]} for a in protocol.body["arms"]}


def sequential_verdicts(protocol: Protocol, runs: dict[str, dict[int, dict[str, Any]]],
                        finals: dict[str, dict[int, float]], window: tuple[float, float]
                        ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Each arm's verdict, look after look (`test.looks`, group sequential): a look is reached when
    colocated and every arm still open have its seeds 0..n-1; an arm whose verdict at an interim look is
    anything but "inconclusive" stops there with it, and the others go on to the next look, Holm over
    the arms still open at each. Returns the latest look reached (with colocated's margin there, and
    `open`: the arms that need more seeds) or None, and the verdicts, each with the seeds of its look."""
    body, test = protocol.body, protocol.body["test"]
    looks = test.get("looks") or [{"seeds": body["seeds"], "alpha": test["alpha"]}]
    out: dict[str, Any] = {}
    latest, still_open = None, [arm for arm in finals if arm != "colocated"]
    for i, look in enumerate(looks):
        if not still_open or not all(set(range(look["seeds"])) <= set(finals[arm])
                                     for arm in ["colocated", *still_open]):
            break
        colocated = mean_curve([runs["colocated"][s]["points"] for s in range(look["seeds"])])
        margin = verdicts.relative_margin(colocated, window, body["margin"]["rise_fraction"],
                                          body["margin"].get("fewer_samples"))
        latest = {**look, "final": i == len(looks) - 1, "margin": margin}
        now = arm_verdicts(protocol, {arm: finals[arm] for arm in ["colocated", *still_open]}, latest,
                           margin["margin"])
        out.update({arm: {**v, "look": look["seeds"], "alpha": look["alpha"]} for arm, v in now.items()})
        still_open = [arm for arm in still_open if now[arm]["verdict"] == "inconclusive" and not latest["final"]]
    if latest is not None:
        latest["open"] = still_open
    return latest, out


def secondary_verdicts(protocol: Protocol, admitted: list[dict[str, Any]], colocated: dict[int, float],
                       arms: dict[str, Any], window: tuple[float, float]) -> dict[str, Any]:
    """Each secondary arm's verdict against colocated at the margin and alpha of the verdict it follows
    up, on that verdict's seeds (one analysis per arm: no Holm); "running" until it has them all."""
    ends: dict[str, dict[int, float]] = {}
    of: dict[str, str] = {}
    for c in admitted:
        if "secondary_of" in c:
            ends.setdefault(c["arm"], {})[c["seed"]] = verdicts.endpoint(c["points"], window)
            of[c["arm"]] = c["secondary_of"]
    out: dict[str, Any] = {}
    for name, by_seed in ends.items():
        primary = arms[of[name]]
        seeds = range(primary["look"])
        if not set(seeds) <= set(by_seed):
            out[name] = {"verdict": "running", "seeds": len(by_seed), "needs": len(seeds)}
            continue
        test = protocol.body["test"]
        v = verdicts.verdict([by_seed[s] - colocated[s] for s in seeds], primary["margin"], alpha=primary["alpha"],
                             p_adjusted=None, planned_sd=test["planned_sd"], power=test.get("power", 0.9))
        out[name] = {**v, "endpoint_mean": statistics.fmean(by_seed[s] for s in seeds)}
    return out


def settled(protocol: Protocol, results: list[dict[str, Any]]) -> set[str]:
    """The arms that need no more cells: those stopped at an interim look, and colocated once none is open."""
    look = summarize(protocol, results)["look"]
    if look is None:
        return set()
    arms = {a["name"] for a in protocol.body["arms"]} - set(look["open"])
    return arms if not look["open"] else arms - {"colocated"}


def arm_verdicts(protocol: Protocol, finals: dict[str, dict[int, float]], look: dict[str, Any],
                 margin: float) -> dict[str, Any]:
    """Each arm's verdict at `look`, Holm over the arms (colocated excluded) within the task."""
    test, seeds = protocol.body["test"], range(look["seeds"])
    diffs = {arm: [by_seed[s] - finals["colocated"][s] for s in seeds] for arm, by_seed in finals.items()
             if arm != "colocated"}
    p_two = {arm: verdicts.paired(d).p_two_sided() for arm, d in diffs.items()}
    adjusted = verdicts.holm(p_two)
    out = {}
    for arm, d in diffs.items():
        v = verdicts.verdict(d, margin, alpha=look["alpha"], p_adjusted=adjusted[arm], planned_sd=test["planned_sd"],
                             power=test.get("power", 0.9))
        if v["verdict"] == "inconclusive" and not look["final"]:
            v["why"] += f" (interim look at {look['seeds']} seeds: continue)"
        out[arm] = {**v, "endpoint_mean": statistics.fmean(finals[arm][s] for s in seeds)}
    return out


def trained(runs: dict[str, dict[int, dict[str, Any]]], seeds_of: dict[str, range],
            window: tuple[float, float]) -> dict[str, Any]:
    """Per arm, over the seeds of its verdict (`seeds_of`): partial ratio, version lag, trained lengths
    (mean, 90th percentile, KS distance from colocated's: seed by seed, which also measures how far two
    runs drift apart, and pooled over the seeds, the distribution's shift; the lag-length correlation)
    and the validation's mean response length over the endpoint window; each mean's shift against
    colocated's over the same seeds."""
    def hist(cell: dict[str, Any]) -> dict[str, list[int]]:
        return cell.get("ledger", {}).get("length_hist_by_lag") or {}

    out = {}
    for arm, seeds in seeds_of.items():
        cs, ref = [runs[arm][s] for s in seeds], [runs["colocated"][s] for s in seeds]
        ledgers = [c.get("ledger", {}) for c in cs]
        row: dict[str, Any] = {"partial_rollout": any(c.get("partial_rollout") for c in cs),
                               "partial_ratio": statistics.fmean(c.get("partial_ratio") or 0.0 for c in cs),
                               "version_lag_max": max(c.get("version_lag_max") or 0 for c in cs),
                               **lengths(cs, window)}
        if "length_mean" in row and all(hist(c) for c in cs + ref):
            row["ks_vs_colocated"] = statistics.fmean(ks_distance(hist(a), hist(b)) for a, b in zip(cs, ref))
            row["ks_pooled_vs_colocated"] = ks_distance(pooled(list(map(hist, cs))), pooled(list(map(hist, ref))))
        if corrs := [x["lag_length_corr"] for x in ledgers if x.get("lag_length_corr") is not None]:
            row["lag_length_corr"] = statistics.fmean(corrs)
        colocated = lengths(ref, window)
        for key in ("length_mean", "val_length_mean"):
            if key in row and key in colocated:
                row[key.replace("_mean", "_shift")] = row[key] / colocated[key] - 1
        out[arm] = row
    return out


def lengths(cells: list[dict[str, Any]], window: tuple[float, float]) -> dict[str, float]:
    """The cells' mean trained length and 90th percentile (from their ledgers) and mean validation
    length over the endpoint window, each where every cell has it."""
    ledgers, out = [c.get("ledger", {}) for c in cells], {}
    if all("length_mean" in x for x in ledgers):
        out["length_mean"] = statistics.fmean(x["length_mean"] for x in ledgers)
        out["length_p90"] = statistics.fmean(x["length_p90"] for x in ledgers)
    if all(p.get("length") is not None for c in cells for p in c["points"]):
        out["val_length_mean"] = statistics.fmean(val_length(c["points"], window) for c in cells)
    return out


def val_length(points: list[dict[str, Any]], window: tuple[float, float]) -> float:
    """A run's mean validation response length over the endpoint window."""
    return statistics.fmean(p["length"] for p in points if window[0] <= p["samples"] <= window[1])


def with_val_lengths(cell: dict[str, Any]) -> dict[str, Any]:
    """A cell recorded before its points carried the validation's mean response length, with the
    lengths read back from its run directory where that is still there (its scores checked the same)."""
    if all("length" in p for p in cell.get("points", [])) or not (Path(cell.get("dir", "")) / "metrics.jsonl").exists():
        return cell
    settings = cell["settings"]
    again = curve(metric_rows(Path(cell["dir"])), settings["batch"], settings["n"])
    assert [p["score"] for p in again] == [p["score"] for p in cell["points"]], f"{cell['dir']} is another run"
    return {**cell, "points": [{**p, "length": q["length"]} for p, q in zip(cell["points"], again)]}


def table(summary: dict[str, Any]) -> str:
    """The markdown verdict table of one study."""
    if summary.get("look") is None:
        return f"{summary['study']}: {summary['verdicts']} ({summary['admitted']} cells admitted)"
    lines = [f"{summary['study']}: look at {summary['look']['seeds']} seeds (alpha {summary['look']['alpha']}), "
             f"margin {summary['margin']['margin']:.3f}; colocated's slope {summary['plateau']}", "",
             "| arm | endpoint | vs colocated | CI (1 - 2 alpha) | verdict | partial ratio | lag max "
             "| trained length shift | KS, pooled | validation length shift |", "|---" * 10 + "|"]
    for arm, v in summary["arms"].items():
        t = summary["trained"][arm]
        shift, ks, val = (f"{t[k]:{f}}" if k in t else "-" for k, f in
                          (("length_shift", "+.0%"), ("ks_pooled_vs_colocated", ".3f"), ("val_length_shift", "+.0%")))
        earlier = v["look"] != summary["look"]["seeds"]
        at = f" (at the {v['look']}-seed look, margin {v['margin']:.3f})" if earlier else ""
        lines.append(f"| {arm} | {v['endpoint_mean']:.3f} | {v.get('mean_diff', 0):+.3f} | {interval(v)} | "
                     f"{v['verdict']}{at} | {t['partial_ratio']:.2f} | {t['version_lag_max']} | {shift} | {ks} "
                     f"| {val} |")
    for name, v in summary.get("secondary", {}).items():
        lines.append(f"| {name} (secondary) | " + (f"{v['seeds']} of {v['needs']} seeds |" if v["verdict"] == "running"
                     else f"{v['endpoint_mean']:.3f} | {v['mean_diff']:+.3f} | {interval(v)} | {v['verdict']} |"))
    return "\n".join(lines)


def interval(v: dict[str, Any]) -> str:
    """A verdict's 1 - 2 alpha interval with its level (99% at an interim look's alpha of 0.005)."""
    return f"{v['ci_level']:.0%}: [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("protocol", type=Path)
    ap.add_argument("--plan", action="store_true", help="list the cells and what stops them, run nothing")
    ap.add_argument("--report", action="store_true", help="only summarise the recorded cells")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/asyncrl-study"))
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--shard", type=shard, default=(0, 1), metavar="I/K",
                    help="run only every K-th cell from the I-th (0-based): K processes, one a core, share a study")
    ap.add_argument("--add-val-lengths", action="store_true",
                    help="give the recorded cells without the validation's response lengths those of their run "
                         "directories, where still there (cells recorded before 2026-11-29 14:00), then report")
    args = ap.parse_args(argv)
    protocol = load_protocol(args.protocol)
    out = RESULTS / f"study_{protocol.body['study']}.jsonl"
    if args.plan:
        print(f"{len(cells(protocol))} cells, budget {protocol.body['budget_cpu_hours']} CPU-hours")
        print("\n".join(ready(protocol)) or "ready")
        return
    if args.add_val_lengths:
        out.write_text("".join(json.dumps(with_val_lengths(c)) + "\n" for c in load(out)))
    elif not args.report:
        run(protocol, out, args.runs_dir, args.timeout_s, args.shard)
    results = load(out)
    summary = summarize(protocol, results)
    out.with_name(f"study_{protocol.body['study']}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    if summary["look"] is not None and importlib.util.find_spec("matplotlib") is None:
        print("no figure: matplotlib is missing (pip install 'asyncrl[bench]')")
    elif summary["look"] is not None:
        admitted = [c for c in results if refusal(c, protocol) is None]
        window = protocol.body["endpoint"]["window_prompts"]
        print(plot(summary, by_arm(protocol, admitted), (window[0], window[1]), IMG))


if __name__ == "__main__":
    main()
