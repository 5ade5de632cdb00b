"""`asyncrl sim`: run a real pipeline on modelled workers in virtual time, and summarise it.

`build_sim_context(cfg)` is the simulator's `build_context`: the same `RunContext`, prompt
stream, router, `ParameterSynchronizer`, trace and metric sinks, with modelled rollout
engines, trainer and weight transport behind the handles. The pipeline module `pipeline=`
names runs unchanged on `loop.run_virtual`. Devices come from the config's own keys:
colocated uses trainer.nnodes x trainer.n_gpus_per_node for everything; decoupled pipelines
give rollout.nnodes x rollout.n_gpus_per_node to rollout (engines of
rollout.tensor_model_parallel_size devices) and trainer.nnodes x trainer.n_gpus_per_node to
training. With a CPU profile the devices are cores (num_threads, rollout/trainer.num_cpus).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import dump_config, old_log_prob_source
from asyncrl.config_schema import Config
from asyncrl.data import PromptIterator
from asyncrl.errors import ConfigError
from asyncrl.pipelines import pipeline_module
from asyncrl.pipelines.setup import RolloutRouter, RunContext
from asyncrl.sim import costs
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import Profile, load_profile
from asyncrl.sim.summary import RunSummary, summarise
from asyncrl.sim.workers import SimHandle, SimRolloutServer, SimTrainer, SimTransport
from asyncrl.sim.workload import Workload, sim_rows
from asyncrl.sync import ParameterSynchronizer
from asyncrl.telemetry.trace import Trace


@dataclasses.dataclass(frozen=True)
class Devices:
    rollout: int
    trainer: int
    engines: int
    per_engine: int


def devices(cfg: Config, profile: Profile) -> Devices:
    """Who gets which devices, from the same keys a real run reads."""
    if profile.device == "cpu":
        cores = cfg.num_threads or os.cpu_count() or 1
        colocated = cfg.pipeline == "colocated"
        rollout, trainer = (cores, cores) if colocated else (cfg.rollout.num_cpus, cfg.trainer.num_cpus)
        engines = cfg.rollout.num_engines
        return Devices(rollout, trainer, engines, max(1, rollout // engines))
    trainer = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    rollout = trainer if cfg.pipeline == "colocated" else cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    if trainer <= 0 or rollout <= 0:
        keys = "trainer.n_gpus_per_node" if cfg.pipeline == "colocated" else \
            "rollout.n_gpus_per_node and trainer.n_gpus_per_node"
        raise ConfigError(f"sim.profile={profile.name} models GPUs: set {keys} (and nnodes)")
    tp = cfg.rollout.tensor_model_parallel_size
    if rollout % tp:
        raise ConfigError(f"rollout.tensor_model_parallel_size={tp} must divide the {rollout} rollout GPUs")
    return Devices(rollout, trainer, rollout // tp, tp)


def sim_config(cfg: Config) -> Config:
    """What a simulated run changes: it always starts fresh and always writes metrics.jsonl."""
    loggers = cfg.trainer.logger if "jsonl" in cfg.trainer.logger else (*cfg.trainer.logger, "jsonl")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume=False, logger=loggers))


def build_sim_context(cfg: Config, log: Callable[[str], None] = print) -> RunContext:
    """Call inside the virtual loop (the trace's origin is virtual time 0)."""
    profile = load_profile(cfg.sim.profile)
    d = devices(cfg, profile)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    dump_config(cfg, out / "config.yaml")
    train_rows, val_rows = sim_rows(cfg)
    workload = Workload(cfg, cfg.seed)
    engines = [SimHandle(f"rollout{i}", SimRolloutServer(cfg, profile, d.per_engine, workload))
               for i in range(d.engines)]
    trainer = SimHandle("trainer", SimTrainer(cfg, profile, d.trainer, old_log_prob_source(cfg)))
    sync = ParameterSynchronizer(trainer, engines, SimTransport(engines, costs.sync_seconds(profile)))
    prompts = PromptIterator(train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, output_dir=out, tokenizer=None, train_rows=train_rows, val_rows=val_rows,
                      prompts=prompts, rollout=RolloutRouter(engines), trainer=trainer, synchronizer=sync,
                      trace=Trace(max_events=cfg.sim.trace_max_events), log=log)


def simulate(cfg: Config, log: Callable[[str], None] = print) -> RunSummary:
    """Run `cfg.pipeline` on the modelled cluster; its outputs go to trainer.output_dir."""
    cfg = sim_config(cfg)
    module = pipeline_module(cfg.pipeline)

    async def main() -> int:
        return await module.run(build_sim_context(cfg, log))

    start = time.perf_counter()
    _, virtual_s = run_virtual(main())
    return summarise(cfg, Path(cfg.trainer.output_dir), virtual_s, time.perf_counter() - start)
