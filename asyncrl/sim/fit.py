"""Fit a profile's efficiencies to measured steps, so the simulator predicts your cluster.

Each timed phase is governed by its own efficiency: generation by the rollout's memory-bound
coefficients and prefill (`decode_step_s`, `mem_bw_eff`, `prefill_mfu` scale together;
`decode_mfu`, the compute-bound large-batch term, is a physical prior that colocated runs,
dominated by their long tail, cannot constrain), `old_log_prob` by `logprob_mfu`, `update_actor`
by `train_mfu`. `fit_profile` simulates every target run with the current profile, multiplies
each phase's efficiency by the geometric mean of simulated / measured over the targets, and
repeats; the cost model is close to linear in these factors, so a few rounds converge. The
physical numbers (FLOP/s, bandwidth, memory, model shape) and the structural costs
(`decode_step_s` split, per-micro-batch and per-optimizer-step costs) are kept as given, except
by `fit_decode_split`, which reads the split of decoding between per-step and per-token cost off
the step rows of runs with a length tail, and `fit_scaling`, which fits how speed grows with
devices from runs on different device counts.

    asyncrl sim run.yaml --fit outputs/run/metrics.jsonl --out my-cluster.yaml
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.sim.profile import Profile, load_profile, save_profile
from asyncrl.sim.summary import read_steps

FITTED = ("gen", "old_log_prob", "update_actor")


def measured_phases(metrics_path: Path, skip: int = 1) -> dict[str, float]:
    """Mean seconds per step of the fitted phases in a real run (first `skip` steps are warm-up)."""
    every = read_steps(metrics_path)
    steps = every[skip:] or every
    out = {}
    for phase in FITTED:
        keys = ("timing_s/gen", "timing_s/generate_sequences") if phase == "gen" else (f"timing_s/{phase}",)
        values = [r[k] for r in steps for k in keys if r.get(k) is not None]
        if values:
            out[phase] = sum(values) / len(values)
    return out


def simulated_phases(cfg: Config, profile: Profile) -> dict[str, float]:
    p = _simulate(cfg, profile)[0].phases
    return {"gen": p.get("gen", p.get("generate_sequences", 0.0)), "old_log_prob": p.get("old_log_prob", 0.0),
            "update_actor": p.get("update_actor", 0.0), "step": p.get("step", 0.0)}


def _simulate(cfg: Config, profile: Profile) -> tuple[Any, list[dict[str, float]]]:
    """The simulated run's summary and its step rows."""
    from asyncrl.sim.run import simulate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        save_profile(profile, path)
        cfg = dataclasses.replace(
            cfg, sim=dataclasses.replace(cfg.sim, profile=str(path), trace_max_events=0),
            trainer=dataclasses.replace(cfg.trainer, output_dir=str(Path(tmp) / "run"), logger=("jsonl",),
                                        test_freq=0, val_before_train=False))
        summary = simulate(cfg, log=lambda _: None)
        return summary, read_steps(Path(tmp) / "run" / "metrics.jsonl")


def fit_decode_split(runs: Sequence[tuple[Config, Path]], profile: Profile,
                     log: Callable[[str], None] = print) -> Profile:
    """How generation time splits between per-step costs and per-sequence compute, from the
    step rows of colocated runs with a length tail (e.g. `rollout.length_from_prompt`, where the
    simulator draws the same lengths): a step's count of decode steps follows its longest
    response, its compute its token count, so steps whose longest responses differ separate the
    two. Grid over `decode_mfu` (the per-sequence term) and `mem_bw_gb_s` (the cached-token
    term; on a CPU the bandwidth that matters is the caches', which a profile cannot know), each
    point followed by a refit of generation's efficiency; the error is the squared log error of
    the per-step generation times."""
    targets = [(cfg, measured_phases(path)) for cfg, path in runs]
    measured = [[r.get("timing_s/gen", 0.0) for r in read_steps(path)[1:]] for _, path in runs]

    def error(trial: Profile) -> tuple[float, Profile]:
        trial = fit_profile(targets, trial, rounds=2, log=lambda _: None, phases=("gen",))
        sims = [[r.get("timing_s/gen", 0.0) for r in _simulate(cfg, trial)[1][1:]] for cfg, _ in runs]
        pairs = [(m, s) for ms, ss in zip(measured, sims) for m, s in zip(ms, ss) if m > 0 and s > 0]
        return sum(math.log(s / m) ** 2 for m, s in pairs), trial

    grid = [dataclasses.replace(profile, decode_mfu=profile.decode_mfu * 4**i, mem_bw_gb_s=profile.mem_bw_gb_s * 4**j)
            for i in range(5) for j in range(4)]
    best_err, best = min((error(trial) for trial in grid), key=lambda pair: pair[0])
    log(f"fit decode_mfu = {best.decode_mfu:.3g}, mem_bw_gb_s = {best.mem_bw_gb_s:.3g}, "
        f"decode_step_s = {best.decode_step_s:.3g} (per-step log error {best_err:.3f})")
    return best


def rescale(profile: Profile, phase: str, factor: float) -> Profile:
    """Make `phase` take `factor` times as long."""
    if phase == "gen":  # decode_mfu stays: a physical prior of large-batch decode (`asyncrl.sim.costs`)
        return dataclasses.replace(
            profile, decode_step_s=profile.decode_step_s * factor, mem_bw_eff=min(profile.mem_bw_eff / factor, 1.0),
            prefill_mfu=profile.prefill_mfu / factor)
    if phase == "old_log_prob":
        return dataclasses.replace(profile, logprob_mfu=profile.logprob_mfu / factor)
    assert phase == "update_actor", phase
    return dataclasses.replace(profile, train_mfu=profile.train_mfu / factor)


def fit_profile(targets: Sequence[tuple[Config, dict[str, float]]], profile: Profile, rounds: int = 4,
                log: Callable[[str], None] = print, phases: Sequence[str] = FITTED) -> Profile:
    """The profile whose simulated phase times best match the measured ones, in log space."""
    for r in range(rounds):
        simulated = [simulated_phases(cfg, profile) for cfg, _ in targets]
        for phase in phases:
            pairs = [(m[phase], s[phase]) for (_, m), s in zip(targets, simulated) if m.get(phase) and s.get(phase)]
            if phase == "old_log_prob" and len(pairs) >= 2:
                profile = _fit_affine_logprob(profile, pairs)
            elif pairs:
                profile = rescale(profile, phase, math.exp(sum(math.log(m / s) for m, s in pairs) / len(pairs)))
        log(f"fit round {r + 1}: " + "; ".join(
            f"{ph} sim {s[ph]:.3g} s vs measured {m.get(ph, float('nan')):.3g} s"
            for (_, m), s in zip(targets, simulated) for ph in FITTED))
    return profile


def _fit_affine_logprob(profile: Profile, pairs: list[tuple[float, float]]) -> Profile:
    """With several runs, fit both the speed and the fixed cost of a log-prob pass:
    measured ≈ k * (simulated - fixed) + fixed', least squares in log space over a grid."""
    compute = [max(s - profile.logprob_pass_s, 1e-9) for _, s in pairs]
    best = (math.inf, 1.0, profile.logprob_pass_s)
    top = min(m for m, _ in pairs)
    for i in range(200):
        fixed = top * i / 200
        k = math.exp(sum(math.log(max(m - fixed, 1e-9) / c) for (m, _), c in zip(pairs, compute)) / len(pairs))
        err = sum((math.log(k * c + fixed) - math.log(m)) ** 2 for (m, _), c in zip(pairs, compute))
        best = min(best, (err, k, fixed))
    _, k, fixed = best
    return dataclasses.replace(profile, logprob_mfu=profile.logprob_mfu / k, logprob_pass_s=fixed)


def fit_scaling(targets: Sequence[tuple[Config, dict[str, float]]], profile: Profile,
                log: Callable[[str], None] = print) -> Profile:
    """With runs that give a side different device counts (2 cores vs 1), fit how speed scales
    with devices: `tp_efficiency` from generation, `dp_efficiency` from the update (grid search
    in log error, each followed by a refit of the phase efficiencies)."""
    for knob, phase in (("tp_efficiency", "gen"), ("dp_efficiency", "update_actor")):
        grid = [0.4 + 0.05 * i for i in range(13)]
        best = min(grid, key=functools.partial(_scaling_error, targets, profile, knob, phase))
        profile = _with_knob(profile, knob, best)
        log(f"fit {knob} = {best:.2f}")
    return fit_profile(targets, profile, rounds=3, log=log)


def _scaling_error(targets: Sequence[tuple[Config, dict[str, float]]], profile: Profile, knob: str,
                   phase: str, value: float) -> float:
    """Squared log error of `phase` over the targets with `knob` = value (phase efficiency refitted)."""
    trial = fit_profile(targets, _with_knob(profile, knob, value), rounds=2, log=lambda _: None,
                        phases=(phase,))
    sims = [simulated_phases(cfg, trial) for cfg, _ in targets]
    return sum(math.log(s[phase] / m[phase]) ** 2 for (_, m), s in zip(targets, sims) if m.get(phase))


def _with_knob(profile: Profile, knob: str, value: float) -> Profile:
    """`profile` with the float field named `knob` set to `value`."""
    changes: dict[str, Any] = {knob: value}
    return dataclasses.replace(profile, **changes)


def fit_from_run(cfg: Config, metrics_path: Path, out: Path, log: Callable[[str], None] = print) -> Profile:
    """`asyncrl sim CONFIG --fit metrics.jsonl`: start from cfg.sim.profile, fit, write `out`."""
    start = load_profile(cfg.sim.profile)
    if not metrics_path.is_file():
        raise ConfigError(f"--fit {metrics_path}: no such file; pass the metrics.jsonl of a measured run")
    measured = measured_phases(metrics_path)
    if not measured:
        raise ConfigError(f"--fit {metrics_path}: no timing_s/gen, old_log_prob or update_actor to fit")
    steps = min(len(read_steps(metrics_path)), 5)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_training_steps=steps))
    fitted = dataclasses.replace(fit_profile([(cfg, measured)], start, log=log), name=out.stem,
                                 description=f"{start.description} Refitted to {metrics_path}.")
    save_profile(fitted, out)
    return fitted
