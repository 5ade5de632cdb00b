"""What the local, processes and Ray substrates share: loading the model, tokenizer and data in
the driver, and how many cores each side of a run (and each worker process) gets."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.models import load_model
from asyncrl.substrates import Log, RunData
from asyncrl.workers.factory import load_data


def load_real_data(cfg: Config, log: Log) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, RunData]:
    """Model and tokenizer (the tiny model is built once here, before any worker loads it), rows."""
    if cfg.rollout.tensor_model_parallel_size != 1:
        raise ConfigError("rollout.tensor_model_parallel_size > 1 is modelled by `asyncrl sim` only; "
                          "the torch engine runs each engine on one device: set it to 1")
    model, tok = load_model(cfg.model, log)
    train_rows, val_rows = load_data(cfg, tok, log)
    return model, tok, RunData(tok, train_rows, val_rows, model.config)


def side_cpus(cfg: Config) -> tuple[int, int]:
    """Cores per side. Colocated: every phase uses all cores in turn; decoupled: each side its own."""
    if cfg.pipeline == "colocated":
        n = cfg.num_threads or os.cpu_count() or 1
        return n, n
    return cfg.rollout.num_cpus, cfg.trainer.num_cpus


@dataclass(frozen=True)
class WorkerShares:
    """Per worker process: the cores a scheduler reserves and the torch threads it runs."""

    rollout_cpus: float
    trainer_cpus: float
    rollout_threads: int
    trainer_threads: int


def worker_shares(cfg: Config) -> WorkerShares:
    """Colocated workers take all cores in turn (each reserves a share); decoupled ones split
    their side's cores between its processes."""
    rollout_cores, trainer_cores = side_cpus(cfg)
    engines = cfg.rollout.num_engines
    if cfg.pipeline == "colocated":
        share = rollout_cores / (engines + 1)
        return WorkerShares(share, share, rollout_cores, rollout_cores)
    return WorkerShares(rollout_cores / engines, float(trainer_cores), max(1, rollout_cores // engines), trainer_cores)


def set_threads(n: int) -> None:
    torch.set_num_threads(n or os.cpu_count() or 1)
