"""What a run achieved, read from its metrics.jsonl: phase times, idle ratios, staleness,
throughput. Used for simulated runs (`asyncrl sim`, `--compare`) and for the measured CPU
runs the benchmarks put next to the simulator's predictions, so both sides are summarised by
the same code.

Idle ratios: fully async logs `trainer/idle_ratio` (waiting for samples / step) and
`rollouter/idle_ratio` (no group in flight / elapsed) itself. For the other pipelines they are
derived the same way: colocated, the trainer waits while generating (gen / step) and the
engines wait while training (1 - gen / step); one-step-off, the trainer waits for
`wait_prev_gen` and the engines idle for step - generate_sequences.

Steps: a step is a training step as verl counts it. For fully async that is one sync cycle of
T = `trigger_parameter_sync_step` local updates (verl logs once per parameter version, summing
each `timing_s/*` over the cycle: recipe/fully_async_policy/detach_utils.py, MetricsAggregator),
so `steps` counts cycles and the phase times are per cycle; metrics.jsonl keeps one line per
update. The stale counters are cumulative, as verl logs them: the summary takes the last value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncrl.config.schema import Config

PHASES = ("gen", "generate_sequences", "wait_prev_gen", "wait_samples", "reward", "old_log_prob", "ref",
          "update_actor", "param_sync", "step")


@dataclass
class RunSummary:
    label: str
    steps: int
    """Training steps; fully async: sync cycles of trigger_parameter_sync_step updates (verl's step)."""
    total_s: float
    """Virtual (or measured) seconds from start to the end of the last step."""
    samples_per_s: float
    trainer_idle: float
    rollout_idle: float
    phases: dict[str, float]
    """Mean seconds per step (fully async: per sync cycle) of each timed phase (timing_s/<phase>)."""
    version_lag_mean: float
    version_lag_max: float
    stale_samples: float
    """verl's fully_async/count/stale_samples_processed at the end: groups trained after a newer version."""
    partial_ratio: float
    preemptions: float
    updates: int = 0
    """Local updates (metrics.jsonl lines); equals `steps` except for fully async."""
    sim_wall_s: float = 0.0
    """Seconds the simulation itself took (0 for measured runs)."""
    turns: int = 0
    """Assistant turns of an episode at most (rollout.multi_turn.max_assistant_turns); 0 = single-turn responses."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def mode_label(cfg: Config) -> str:
    if cfg.pipeline != "fully_async":
        return cfg.pipeline
    a = cfg.async_training
    mode = "d" if a.partial_rollout else "c" if a.staleness_threshold > 0 else \
        "b" if a.trigger_parameter_sync_step > 1 else "a"
    return f"fully_async ({mode})"


def read_steps(path: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("timing_s/step") is not None]


def summarise(cfg: Config, output_dir: Path, total_s: float | None = None, sim_wall_s: float = 0.0,
              label: str | None = None) -> RunSummary:
    steps = read_steps(output_dir / "metrics.jsonl")
    assert steps, f"no steps in {output_dir / 'metrics.jsonl'}"
    cycles = sync_cycles(steps, updates_per_step(cfg))
    phases = {p: _cycle_mean(cycles, f"timing_s/{p}") for p in PHASES if any(f"timing_s/{p}" in r for r in steps)}
    total = total_s if total_s is not None else sum(r["timing_s/step"] for r in steps)
    trainer_idle, rollout_idle = _idle(cfg.pipeline, steps)
    return RunSummary(
        label=label or mode_label(cfg), steps=len(cycles), updates=len(steps), total_s=total,
        samples_per_s=sum(r.get("training/responses", 0) for r in steps) / max(total, 1e-9),
        trainer_idle=trainer_idle, rollout_idle=rollout_idle, phases=phases,
        version_lag_mean=_mean(steps, "staleness/version_lag_mean"),
        version_lag_max=max((r.get("staleness/version_lag_max", 0) for r in steps), default=0),
        stale_samples=steps[-1].get("fully_async/count/stale_samples_processed", 0),
        partial_ratio=_mean(steps, "fully_async/partial/partial_ratio"),
        preemptions=steps[-1].get("rollouter/preemptions", 0.0), sim_wall_s=sim_wall_s,
        turns=cfg.rollout.multi_turn.max_assistant_turns if cfg.rollout.multi_turn.enable else 0)


def updates_per_step(cfg: Config) -> int:
    """Local updates in one training step: T for fully async (verl's step), else 1."""
    return cfg.async_training.trigger_parameter_sync_step if cfg.pipeline == "fully_async" else 1


def sync_cycles(steps: list[dict[str, float]], per_cycle: int) -> list[list[dict[str, float]]]:
    """Update lines grouped by step: update k (1-based `training/global_step`) is in cycle
    (k - 1) // per_cycle, as the pipeline syncs after every per_cycle-th update (and the last).

    Example: per_cycle=4, updates 1..10 -> cycles [1-4], [5-8], [9-10]."""
    out: dict[int, list[dict[str, float]]] = {}
    for i, r in enumerate(steps):
        k = int(r.get("training/global_step", i + 1))
        out.setdefault((k - 1) // per_cycle, []).append(r)
    return list(out.values())


def _cycle_mean(cycles: list[list[dict[str, float]]], key: str) -> float:
    """Mean over cycles of the key's total in each (verl sums timing_s/* over a cycle)."""
    totals = [sum(r[key] for r in c if r.get(key) is not None) for c in cycles if any(key in r for r in c)]
    return sum(totals) / len(totals) if totals else 0.0


def _idle(pipeline: str, steps: list[dict[str, float]]) -> tuple[float, float]:
    def ratio(key: str) -> float:
        ratios = [r.get(key, 0.0) / r["timing_s/step"] for r in steps if r["timing_s/step"] > 0]
        return sum(ratios) / len(ratios) if ratios else 0.0

    if pipeline == "fully_async":
        return _mean(steps, "trainer/idle_ratio"), steps[-1].get("rollouter/idle_ratio", 0.0)
    if pipeline == "one_step_off":
        return ratio("timing_s/wait_prev_gen"), max(0.0, 1 - ratio("timing_s/generate_sequences"))
    gen = ratio("timing_s/gen")
    return gen, 1 - gen


def _mean(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else 0.0


def table(summaries: list[RunSummary]) -> str:
    """A markdown table, one row per run; a footnote says what a step is."""
    base = summaries[0].total_s
    head = ("| run | steps | total | vs first | samples/s | step s | gen s | old_lp s | update s | sync s "
            "| trainer idle | rollout idle | lag mean/max | partial |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in summaries:
        p = s.phases
        gen = p.get("gen", p.get("generate_sequences", p.get("wait_samples", 0.0)))
        lines.append(
            f"| {s.label} | {s.steps} | {_duration(s.total_s)} | {base / s.total_s:.2f}x | {s.samples_per_s:.3g} "
            f"| {p.get('step', 0):.1f} | {gen:.1f} | {p.get('old_log_prob', 0):.1f} | {p.get('update_actor', 0):.1f} "
            f"| {p.get('param_sync', 0):.2f} | {s.trainer_idle:.2f} | {s.rollout_idle:.2f} "
            f"| {s.version_lag_mean:.2f}/{s.version_lag_max:.0f} | {s.partial_ratio:.2f} |")
    lines.append("\nstep = one training step; fully async: one sync cycle of T = trigger_parameter_sync_step "
                 "local updates (verl's step), its phase times summed over the cycle.")
    lines += turn_speedups(summaries)
    return "\n".join(lines)


def turn_speedups(summaries: list[RunSummary]) -> list[str]:
    """The fully async (d) speed-up over colocated (total time) for multi-turn episodes beside
    single-turn responses, when both pairs are among the runs (`asyncrl sim --compare turns`).

    Example: colocated 3360 s and (d) 1418 s with 4 turns, 3108 s and 1193 s single-turn:
    "fully_async (d) over colocated: 2.37x with 4-turn episodes, 2.61x single-turn"."""
    def pick(label: str, multi: bool) -> RunSummary | None:
        return next((s for s in summaries if s.label.startswith(label) and (s.turns > 0) == multi), None)

    pairs = {multi: (pick("colocated", multi), pick("fully_async (d)", multi)) for multi in (True, False)}
    if not all(c and d for c, d in pairs.values()):
        return []
    (col, d), (col1, d1) = pairs[True], pairs[False]
    assert col and d and col1 and d1
    return [f"fully_async (d) over colocated: {col.total_s / d.total_s:.2f}x with {d.turns}-turn episodes, "
            f"{col1.total_s / d1.total_s:.2f}x single-turn"]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    d, rest = divmod(int(round(seconds)), 86400)
    h, rest = divmod(rest, 3600)
    return f"{d}d {h}h {rest // 60}m" if d else f"{h}h {rest // 60}m" if h else f"{rest // 60}m {rest % 60}s"
