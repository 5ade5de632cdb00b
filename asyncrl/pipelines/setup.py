"""Build a run from the config on a substrate: data and prompt stream in the driver, the workers
(as their roles) behind one rollout router, the weight synchronizer and the trace.
`build_context(cfg)` is the only place that reads the whole config; every substrate (local,
ray, sim) goes through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import check_pipeline_keys, config_to_dict, dump_config
from asyncrl.config_schema import Config
from asyncrl.data import PromptIterator
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.pipelines.rundir import prepare_run
from asyncrl.pipelines.stopping import StopControl
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.sync import ParameterSynchronizer
from asyncrl.telemetry.loggers import Tracker, make_tracker
from asyncrl.telemetry.trace import Trace
from asyncrl.types import Group, Mode, PromptRow, Trajectory

if TYPE_CHECKING:  # the simulator builds contexts without transformers
    from transformers import PreTrainedTokenizerBase

    from asyncrl.substrates import Substrate


class RolloutRouter:
    """Every rollout worker behind one door: each group goes to the least-loaded worker.

    The only router: a worker holds one engine, so a group's responses share its KV cache."""

    def __init__(self, workers: Sequence[RolloutSide]) -> None:
        assert workers, "a run needs at least one rollout worker"
        self.workers = list(workers)
        self._in_flight = [0] * len(self.workers)
        self._owner: dict[str, int] = {}

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True) -> Group:
        i = self._in_flight.index(min(self._in_flight))
        self._in_flight[i] += 1
        self._owner[uid] = i
        try:
            return await self.workers[i].generate_scored(row, n, uid, mode, score)
        finally:
            self._in_flight[i] -= 1
            self._owner.pop(uid, None)

    async def score(self, groups: list[Group]) -> list[Group]:
        return await self.workers[0].score(groups)

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Abort these requests (`{uid}/{i}`) on the workers running their groups."""
        by_worker: dict[int, list[str]] = {}
        for rid in request_ids:
            owner = self._owner.get(rid.rpartition("/")[0])
            if owner is not None:
                by_worker.setdefault(owner, []).append(rid)
        parts = await asyncio.gather(*(self.workers[i].abort(ids) for i, ids in by_worker.items()))
        return [t for part in parts for t in part]

    async def stats(self) -> dict[str, float]:
        """Every worker's stats, summed (they are counts and rates)."""
        total: dict[str, float] = {}
        for stats in await asyncio.gather(*(w.stats() for w in self.workers)):
            for key, value in stats.items():
                total[key] = total.get(key, 0.0) + value
        return total


@dataclass
class RunContext:
    cfg: Config
    output_dir: Path
    tokenizer: PreTrainedTokenizerBase | None
    train_rows: list[PromptRow]
    val_rows: list[PromptRow]
    prompts: PromptIterator
    rollout: RolloutRouter
    trainer: TrainerSide
    synchronizer: ParameterSynchronizer
    trace: Trace
    ledger: SampleLedger
    stop: StopControl
    close: Callable[[], None]
    log: Callable[[str], None] = print
    tracker: Tracker | None = None
    total_steps: int = 0
    step: int = 0
    """Policy updates finished (and recorded in the prompt stream and the ledger)."""
    training: bool = False
    """An update is running: its weights and its prompts do not agree until it ends."""
    resume_from: Path | None = None
    """The checkpoint this run starts from (`trainer.resume_mode`)."""
    last_checkpoint: Path | None = None
    """The checkpoint this run resumed from or last wrote: saving its step again is skipped, so
    the checkpoint a run started from is never rewritten."""
    pipeline_state: Callable[[], dict[str, Any]] | None = None
    """The pipeline's own part of a checkpoint, taken at one instant (see `checkpoint.snapshot`)."""


def build_context(cfg: Config, *, log: Callable[[str], None] = print,
                  substrate: Substrate | None = None) -> RunContext:
    """A run on `substrate` (default: the real one `backend=` names, after checking that every
    key set is read by the chosen pipeline)."""
    from asyncrl.substrates import substrate_for
    from asyncrl.training.optim import seed_everything

    if substrate is None:
        check_pipeline_keys(cfg)
        substrate = substrate_for(cfg)
    cfg, resume_from = prepare_run(cfg, log)
    seed_everything(cfg.seed)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.yaml")
    data = substrate.load_data(cfg, log)
    workers = substrate.build_workers(cfg, log)
    sync = ParameterSynchronizer(workers.trainer, workers.rollouts, workers.transport)
    prompts = PromptIterator(data.train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, output_dir=out, tokenizer=data.tokenizer, train_rows=data.train_rows,
                      val_rows=data.val_rows, prompts=prompts, rollout=RolloutRouter(workers.rollouts),
                      trainer=workers.trainer, synchronizer=sync,
                      trace=Trace(max_events=substrate.trace_max_events), ledger=SampleLedger(out / "samples.jsonl"),
                      stop=StopControl(cfg.trainer.stop_timeout_s, log), close=workers.close, log=log,
                      resume_from=resume_from)


def open_tracker(ctx: RunContext, initial_step: int) -> Tracker:
    t = ctx.cfg.trainer
    return make_tracker(t.logger, ctx.output_dir, total_steps=ctx.total_steps or t.total_training_steps,
                        initial_step=initial_step, project=t.project_name,
                        experiment=t.experiment_name, config=config_to_dict(ctx.cfg), log=ctx.log)
