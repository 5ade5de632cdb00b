"""`asyncrl sim`: run a real pipeline on modelled workers in virtual time, and summarise it.

The run is built by the one context builder (`asyncrl.pipelines.setup.build_context`) on the
simulator's substrate (`asyncrl.sim.substrate.SimSubstrate`): the same `RunContext`, prompt
stream, router, `ParameterSynchronizer`, trace and metric sinks, with modelled rollout
engines, trainer and weight transport. The pipeline module `pipeline=` names runs unchanged
on `loop.run_virtual`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.config.schema import Config
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.rundir import new_run_dir
from asyncrl.pipelines.setup import build_context
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import load_profile
from asyncrl.sim.substrate import SimSubstrate
from asyncrl.sim.summary import RunSummary, summarise


def sim_config(cfg: Config) -> Config:
    """What a simulated run changes: it always starts fresh (in a new run directory unless
    trainer.output_dir names one) and always writes metrics.jsonl."""
    t = cfg.trainer
    loggers = t.logger if "jsonl" in t.logger else (*t.logger, "jsonl")
    out = t.output_dir or str(new_run_dir(f"sim-{t.experiment_name}"))
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, resume_mode="disable", logger=loggers,
                                                                output_dir=out))


def simulate(cfg: Config, log: Callable[[str], None] = print) -> RunSummary:
    """Run `cfg.pipeline` on the modelled cluster; its outputs go to trainer.output_dir."""
    cfg = sim_config(cfg)
    module = pipeline_module(cfg.pipeline)
    profile = load_profile(cfg.sim.profile)

    async def main() -> int:  # built inside the virtual loop: the trace's origin is virtual time 0
        return int(await module.run(build_context(cfg, log=log, substrate=SimSubstrate(profile))))

    start = time.perf_counter()
    _, virtual_s = run_virtual(main())
    return summarise(cfg, Path(cfg.trainer.output_dir), virtual_s, time.perf_counter() - start)
