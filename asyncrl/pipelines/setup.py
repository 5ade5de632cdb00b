"""Build a run from the config on a substrate: its run directory (`rundir`), this process's
seeds, the data and prompt stream in the driver, the run plan (`scheduling.plan`: on CUDA sized
by the device's memory and the model's shape; logged in one start line, saved as `plan.json`
beside the `config.yaml` it came from), the workers (as their roles) behind one
`RolloutRouter`, the weight synchronizer and the trace, in one `RunContext`. Every substrate
(local, processes, ray, sim) goes through `build_context`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from asyncrl.config import check_pipeline_keys, config_to_dict, dump_config
from asyncrl.config.keys import settings_line
from asyncrl.config.schema import Config
from asyncrl.data import PromptIterator
from asyncrl.pipelines.context import RunContext, log_line
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.pipelines.router import RolloutRouter
from asyncrl.pipelines.rundir import claim_run
from asyncrl.pipelines.runlock import RunLock
from asyncrl.pipelines.stopping import StopControl
from asyncrl.scheduling.micro_budget import ModelShape, TrainerDevice
from asyncrl.scheduling.plan import plan_run
from asyncrl.sync import ParameterSynchronizer
from asyncrl.telemetry.generations import GENERATIONS_FILE
from asyncrl.telemetry.loggers import Tracker, make_tracker
from asyncrl.telemetry.trace import Trace

if TYPE_CHECKING:
    from asyncrl.substrates import Substrate


def build_context(cfg: Config, *, log: Callable[[str], None] = log_line,
                  substrate: Substrate | None = None, started: bool = False) -> RunContext:
    """A run on `substrate` (default: the real one `backend=` names, after checking that every
    key set is read by the chosen pipeline). `started`: the settings line is out already
    (`asyncrl train` prints it before the heavy imports)."""
    from asyncrl.substrates.registry import substrate_for

    if substrate is None:
        check_pipeline_keys(cfg)
        substrate = substrate_for(cfg)
    cfg, resume_from, lock = claim_run(cfg, log)  # before anything is written in the run directory
    try:
        return _build(cfg, resume_from, lock, log, substrate, started)
    except BaseException:
        lock.release()
        raise


def _build(cfg: Config, resume_from: Path | None, lock: RunLock, log: Callable[[str], None],
           substrate: Substrate, started: bool) -> RunContext:
    seed_everything(cfg.seed)
    out = Path(cfg.trainer.output_dir)
    dump_config(cfg, out / "config.yaml")
    data = substrate.load_data(cfg, log)
    plan = plan_run(cfg, substrate.device, trainer_device(cfg, data.model_config))
    if not started:
        log(settings_line(cfg))
    log(plan.line())
    (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
    workers = substrate.build_workers(cfg, plan, log)
    router = RolloutRouter(workers.rollouts, cfg.rollout.max_restarts, log=log)
    sync = ParameterSynchronizer(workers.trainer, workers.rollouts, workers.transport, on_transfer=router.rejoin)
    prompts = PromptIterator(data.train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, plan=plan, output_dir=out, tokenizer=data.tokenizer, train_rows=data.train_rows,
                      val_rows=data.val_rows, prompts=prompts, rollout=router,
                      trainer=workers.trainer, synchronizer=sync,
                      trace=Trace(max_events=substrate.trace_max_events), ledger=SampleLedger(out / "samples.jsonl"),
                      stop=StopControl(cfg.trainer.stop_timeout_s, log), close=_closer(workers.close, lock), log=log,
                      resume_from=resume_from)


def _closer(close_workers: Callable[[], None], lock: RunLock) -> Callable[[], None]:
    """The run's `close`: its workers, then the run directory's lock."""
    def close() -> None:
        try:
            close_workers()
        finally:
            lock.release()
    return close


def trainer_device(cfg: Config, model_config: Any) -> TrainerDevice | None:
    """What sizes a CUDA trainer's micro-batches: the memory of this process's first GPU (the
    trainer's, or one like it under Ray) and the model's shape; None off CUDA, where no GPU is
    visible here, or for a model config without the sizes (the plan then keeps the CPU's budget)."""
    shape = ModelShape.from_hf(model_config) if model_config is not None else None
    if cfg.trainer.device != "cuda" or shape is None or not torch.cuda.is_available():
        return None
    # the total from the properties, not mem_get_info, which would need a CUDA context in the driver
    return TrainerDevice(torch.cuda.get_device_properties(0).total_memory, shape)


def seed_everything(seed: int) -> None:
    """Seed this process's Python, NumPy and torch generators, once per run, before its data and
    workers are built (each engine seeds its own sampler from the run's seed)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def open_tracker(ctx: RunContext, initial_step: int) -> Tracker:
    """The run's sinks: `trainer.logger`'s, and metrics.jsonl whatever it lists (the run's record,
    which `sim --fit`, `asyncrl report` and resume read; not a logger to choose)."""
    t = ctx.cfg.trainer
    names = t.logger if "jsonl" in t.logger else (*t.logger, "jsonl")
    return make_tracker(names, ctx.output_dir, total_steps=ctx.plan.updates,
                        initial_step=initial_step, project=t.project_name,
                        experiment=t.experiment_name, config=config_to_dict(ctx.cfg), log=ctx.log,
                        trace=ctx.trace, generations=generations_paths(ctx))


def generations_paths(ctx: RunContext) -> dict[str, Path]:
    """Where each split's generations go (`trainer.rollout_data_dir`, `validation_data_dir`, else
    the run directory), for the splits logged; none in the simulator (no tokenizer, no text)."""
    t = ctx.cfg.trainer
    if ctx.tokenizer is None:
        return {}
    dirs = {"train": (t.log_generations, t.rollout_data_dir), "val": (t.log_val_generations, t.validation_data_dir)}
    return {split: Path(where or ctx.output_dir) / GENERATIONS_FILE for split, (k, where) in dirs.items() if k}
