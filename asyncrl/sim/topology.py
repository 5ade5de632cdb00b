"""The simulator's topology: which devices each side gets, and what one rollout engine is made of
(decode and prefill speed, KV capacity, batch) at the configured tensor-parallel size or another.

Devices come from the config's own keys: colocated uses trainer.nnodes x
trainer.n_gpus_per_node for everything; decoupled pipelines give rollout.nnodes x
rollout.n_gpus_per_node to rollout (engines of rollout.tensor_model_parallel_size devices)
and trainer.nnodes x trainer.n_gpus_per_node to training. With a CPU profile the devices are
cores (num_threads, rollout/trainer.num_cpus).

A tensor-parallel change (the TP planner, `asyncrl.pipelines.planning`) keeps the servers:
each server's devices stay its own slice of the rollout devices, and the slice becomes a share
of an engine of the new TP (or holds several such engines), so the devices form devices / tp
engines with that TP's speed and KV capacity (`engine_shape`, `costs.shared_engine`). The
change takes no modelled time: between two colocated steps nothing is in flight, and the
engines are woken up for the next step anyway.

Not here: the cost formulas (`costs.py`), building the workers (`substrate.py`).
"""

from __future__ import annotations

import dataclasses
import os

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.sim import costs
from asyncrl.sim.profile import Profile


@dataclasses.dataclass(frozen=True)
class Devices:
    """Devices (GPUs, or cores with a CPU profile) per side, and how the rollout ones form engines."""

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


def kv_capacity(cfg: Config, profile: Profile, engine_devices: int) -> int:
    """Tokens the KV cache of one engine of `engine_devices` devices holds: `rollout.kv_budget_tokens`
    with a CPU profile (the real CPU engine's budget), else what the devices' memory leaves after
    the weights (`costs.kv_capacity_tokens`)."""
    if profile.device == "cpu":
        return cfg.rollout.kv_budget_tokens
    return costs.kv_capacity_tokens(profile, engine_devices)


def engine_shape(cfg: Config, profile: Profile, tp: int) -> tuple[tuple[float, float, float], float, int, int]:
    """One server's engine model when the rollout TP is `tp` instead of the configured size:
    (decode coefficients, prefill s/token, KV capacity, max seqs). At the configured TP it is
    exactly the engine the server was built with.

    Example: 16 GPUs at TP 2 are 8 servers of 2 GPUs; at TP 8 each server is a quarter of one of
    2 engines of 8 GPUs (1/4 of its KV capacity and of its batch); at TP 1 each holds 2 engines."""
    per_engine = devices(cfg, profile).per_engine
    engine_devices = max(1, per_engine * tp // cfg.rollout.tensor_model_parallel_size)
    return costs.shared_engine(profile, engine_devices, per_engine / engine_devices,
                               kv_capacity(cfg, profile, engine_devices), cfg.rollout.max_num_seqs)


def with_memory_utilization(profile: Profile, utilization: float) -> Profile:
    """`profile` with the engines' memory share set by `sim.gpu_memory_utilization` (0 keeps it).

    Example: h20-qwen2.5-7b at 0.9 instead of 0.85: a TP-4 engine holds (4 x 96 x 0.9 - 15.2) GB
    / 57344 B = 5.76M cached tokens instead of 5.43M."""
    if utilization == 0.0:
        return profile
    if not 0.0 < utilization <= 1.0:
        raise ConfigError(f"sim.gpu_memory_utilization={utilization} must be in (0, 1] (0 = the profile's value)")
    return dataclasses.replace(profile, gpu_memory_utilization=utilization)
