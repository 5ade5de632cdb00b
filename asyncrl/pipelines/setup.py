"""Build a run from the config: data and prompt stream in the driver, the rollout and trainer
sides behind worker handles (in this process or in Ray actors), the weight synchronizer and
the metric sinks. `build_context(cfg)` is the only place that reads the whole config.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import config_to_dict, dump_config
from asyncrl.config_schema import Config
from asyncrl.data import PromptIterator
from asyncrl.errors import ConfigError
from asyncrl.sync import ParameterSynchronizer, default_transport
from asyncrl.telemetry.loggers import Tracker, make_tracker
from asyncrl.telemetry.trace import Trace
from asyncrl.training.optim import seed_everything
from asyncrl.types import Group, Mode, PromptRow
from asyncrl.workers.group import LocalHandle, WorkerHandle

if TYPE_CHECKING:  # the simulator builds contexts without transformers
    from transformers import PreTrainedTokenizerBase


class RolloutRouter:
    """Several rollout hosts behind one door: each group goes to the least-loaded host."""

    def __init__(self, handles: Sequence[WorkerHandle]) -> None:
        self.handles = list(handles)
        self._in_flight = [0] * len(self.handles)

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True) -> Group:
        i = self._in_flight.index(min(self._in_flight))
        self._in_flight[i] += 1
        try:
            return await self.handles[i].call("generate_scored", row, n, uid, mode, score)
        finally:
            self._in_flight[i] -= 1

    async def call_all(self, method: str, *args: Any) -> list[Any]:
        return list(await asyncio.gather(*(h.call(method, *args) for h in self.handles)))


@dataclass
class RunContext:
    cfg: Config
    output_dir: Path
    tokenizer: PreTrainedTokenizerBase | None
    train_rows: list[PromptRow]
    val_rows: list[PromptRow]
    prompts: PromptIterator
    rollout: RolloutRouter
    trainer: WorkerHandle
    synchronizer: ParameterSynchronizer
    trace: Trace
    log: Callable[[str], None] = print
    tracker: Tracker | None = None
    total_steps: int = 0

    def close(self) -> None:
        for handle in [*self.rollout.handles, self.trainer]:
            handle.close()


def set_threads(n: int) -> None:
    torch.set_num_threads(n or os.cpu_count() or 1)


def build_context(cfg: Config, *, log: Callable[[str], None] = print) -> RunContext:
    if cfg.rollout.tensor_model_parallel_size != 1:
        raise ConfigError("rollout.tensor_model_parallel_size > 1 is modelled by `asyncrl sim` only; "
                          "the torch engine runs each engine on one device: set it to 1")
    from asyncrl.models import load_model
    from asyncrl.workers.factory import build_trainer_side, load_data
    from asyncrl.workers.rollout_server import build_rollout_server

    seed_everything(cfg.seed)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.yaml")
    model, tok = load_model(cfg.model, log)  # builds the tiny model once, before any host does
    train_rows, val_rows = load_data(cfg, tok, log)
    rollout_cpus, trainer_cpus = _cpus(cfg)
    set_threads(rollout_cpus if cfg.backend == "local" else cfg.num_threads)
    make_handle = _handle_factory(cfg.backend)
    shared = {"model": model, "tok": tok} if cfg.backend == "local" else {}
    rollout = make_handle("rollout0", functools.partial(build_rollout_server, cfg, **shared),
                          backend=cfg.backend, num_cpus=rollout_cpus)
    trainer = make_handle("trainer", functools.partial(build_trainer_side, cfg, **shared),
                          backend=cfg.backend, num_cpus=trainer_cpus)
    gpus = cfg.trainer.device == "cuda"
    sync = ParameterSynchronizer(trainer, [rollout], default_transport(cfg.backend, gpus=gpus))
    prompts = PromptIterator(train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, output_dir=out, tokenizer=tok, train_rows=train_rows, val_rows=val_rows,
                      prompts=prompts, rollout=RolloutRouter([rollout]), trainer=trainer,
                      synchronizer=sync, trace=Trace(), log=log)


def _handle_factory(backend: str) -> Callable[..., WorkerHandle]:
    """Handles for the chosen substrate; Ray is imported (and started) only when asked for."""
    if backend == "local":
        return lambda name, factory, *, backend, num_cpus: LocalHandle(name, factory)
    from asyncrl.workers.ray_host import init_ray, make_handle

    init_ray(os.environ.get("RAY_ADDRESS"))
    return make_handle


def _cpus(cfg: Config) -> tuple[int, int]:
    """Cores per side. Colocated: every phase uses all cores in turn; decoupled: each side its own."""
    if cfg.pipeline == "colocated":
        n = cfg.num_threads or os.cpu_count() or 1
        return n, n
    return cfg.rollout.num_cpus, cfg.trainer.num_cpus


def open_tracker(ctx: RunContext, initial_step: int) -> Tracker:
    t = ctx.cfg.trainer
    return make_tracker(t.logger, ctx.output_dir, total_steps=ctx.total_steps or t.total_training_steps,
                        initial_step=initial_step, project=t.project_name,
                        experiment=t.experiment_name, config=config_to_dict(ctx.cfg))
