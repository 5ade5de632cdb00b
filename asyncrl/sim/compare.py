"""`asyncrl sim --compare`: the same workload under several pipelines, modes or splits.

Each variant is a string of overrides applied on top of the base config, e.g.
`--compare "pipeline=colocated" "pipeline=fully_async async_training.staleness_threshold=0.5"`.
`--compare modes` expands to colocated, one-step-off and fully async (a)-(d) on the base
config's rollout/trainer split (colocated gets all of those devices). `--compare turns` (a
config with `rollout.multi_turn.enable=true`): colocated and fully async (d) with the config's
episodes and again with single-turn responses, and the two speed-ups of (d) over colocated
printed under the table (`--compare modes` on such a config adds the same two single-turn rows
and line). Modes (b)-(d) sync once
per train_batch_size prompts (T = train_batch_size / (require_batches x ppo_mini_batch_size), the
fair comparison with colocated that verl's recipes use); (c) and (d) allow staleness 0.5.
Results: a markdown table on stdout and `compare.md` / `compare.json` in trainer.output_dir.
A row's steps are training steps as verl counts them: for fully async, sync cycles of
T = trigger_parameter_sync_step local updates (phase times per cycle; `updates` in compare.json
counts the updates), so its "step s" compares with colocated's step for the same prompts.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.scheduling.plan import plan_run
from asyncrl.sim.run import sim_config, simulate
from asyncrl.sim.summary import RunSummary, table


def modes(cfg: Config) -> dict[str, str]:
    """Overrides of one-step-off and the four fully async modes for `cfg`'s batch sizes."""
    as_async = dataclasses.replace(cfg, pipeline="fully_async")
    sync_every = max(1, cfg.data.train_batch_size // plan_run(as_async).prompts_per_update)
    fair = f"pipeline=fully_async async_training.trigger_parameter_sync_step={sync_every}"
    return {"one_step_off": "pipeline=one_step_off",
            "fully_async (a)": "pipeline=fully_async async_training.trigger_parameter_sync_step=1",
            "fully_async (b)": fair,
            "fully_async (c)": f"{fair} async_training.staleness_threshold=0.5",
            "fully_async (d)": f"{fair} async_training.staleness_threshold=0.5 async_training.partial_rollout=true"}


def expand(variants: list[str], base: Config) -> dict[str, str]:
    """Label → overrides. 'modes' becomes colocated (on every device) plus `modes(base)`;
    'turns' colocated and fully async (d); with multi-turn episodes either also adds both
    single-turn ("..., single-turn": rollout.multi_turn.enable=false)."""
    out: dict[str, str] = {}
    for v in variants:
        if v == "modes":
            out["colocated"] = _colocated_on_all(base)
            out |= modes(base)
        elif v == "turns":
            if not base.rollout.multi_turn.enable:
                raise ConfigError("--compare turns compares multi-turn episodes with single-turn responses: "
                                  "set rollout.multi_turn.enable=true (and rollout.multi_turn.max_assistant_turns)")
            out |= {"colocated": _colocated_on_all(base), "fully_async (d)": modes(base)["fully_async (d)"]}
        else:
            out[v] = v
    if base.rollout.multi_turn.enable and ("modes" in variants or "turns" in variants):
        single = " rollout.multi_turn.enable=false"
        out |= {f"{label}, single-turn": out[label] + single for label in ("colocated", "fully_async (d)")}
    return out


def _colocated_on_all(cfg: Config) -> str:
    r, t = cfg.rollout, cfg.trainer
    if r.n_gpus_per_node == 0:  # CPU or already colocated
        return "pipeline=colocated"
    total = r.nnodes * r.n_gpus_per_node + t.nnodes * t.n_gpus_per_node
    per_node = t.n_gpus_per_node if total % t.n_gpus_per_node == 0 else total
    return f"pipeline=colocated trainer.nnodes={total // per_node} trainer.n_gpus_per_node={per_node}"


def compare(path: str | None, overrides: list[str], variants: list[str],
            log: Callable[[str], None] = print) -> list[RunSummary]:
    base = sim_config(load_config(path, overrides))
    out = Path(base.trainer.output_dir)
    summaries = []
    for i, (label, extra) in enumerate(expand(variants, base).items()):
        try:
            cfg = load_config(path, [*overrides, *shlex.split(extra), f"trainer.output_dir={out / f'variant{i}'}"])
        except ConfigError as exc:
            raise ConfigError(f"--compare {label!r}: {exc}") from None
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
            cfg.trainer, logger=tuple(x for x in cfg.trainer.logger if x != "console")))
        summary = simulate(cfg, log=lambda _: None)
        summaries.append(dataclasses.replace(summary, label=label))
        log(f"{label}: {summary.total_s:.0f} virtual s ({summary.sim_wall_s:.1f} s to simulate)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table(summaries) + "\n")
    (out / "compare.json").write_text(json.dumps([s.as_dict() for s in summaries], indent=1))
    return summaries
