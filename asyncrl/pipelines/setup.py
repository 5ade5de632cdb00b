"""Build a run from the config on a substrate: data and prompt stream in the driver, the workers
(as their roles) behind one rollout router, the weight synchronizer and the trace.
`build_context(cfg)` is the only place that reads the whole config; every substrate (local,
ray, sim) goes through it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import check_pipeline_keys, config_to_dict, dump_config
from asyncrl.config.schema import Config
from asyncrl.data import PromptIterator
from asyncrl.errors import WorkerDied
from asyncrl.pipelines.ledger import SampleLedger
from asyncrl.pipelines.rundir import prepare_run
from asyncrl.pipelines.stopping import StopControl
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.sync import ParameterSynchronizer
from asyncrl.telemetry.loggers import Tracker, make_tracker
from asyncrl.telemetry.trace import Trace
from asyncrl.types import Group, Mode, PromptRow, Trajectory

logger = logging.getLogger("asyncrl.run")
"""What a run says as it goes (resumes, restarts, stops, dropped rows); `asyncrl --log-level` filters it."""


def log_line(message: str) -> None:
    """A run's message to `logger`: at WARNING when it says so ("warning: ..."), else INFO."""
    (logger.warning if message.lstrip().lower().startswith("warning") else logger.info)(message)


if TYPE_CHECKING:  # the simulator builds contexts without transformers
    from transformers import PreTrainedTokenizerBase

    from asyncrl.substrates import Substrate


class RolloutRouter:
    """Every rollout worker behind one door: each group goes to the least-loaded worker.

    The only router: a worker holds one engine, so a group's responses share its KV cache.
    A worker that dies (`WorkerDied`) while Ray may restart it (`rollout.max_restarts`) is set
    aside: its groups are generated again from the start on the others, and it rejoins once the
    next weight sync has given it the run's weights (`rejoin`)."""

    def __init__(self, workers: Sequence[RolloutSide], max_restarts: int = 0,
                 log: Callable[[str], None] = log_line) -> None:
        assert workers, "a run needs at least one rollout worker"
        self.workers = list(workers)
        self.max_restarts = max_restarts
        self.log = log
        self._in_flight = [0] * len(self.workers)
        self._owner: dict[str, int] = {}
        self._restarts = [0] * len(self.workers)
        self._waiting_for_sync: set[int] = set()

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group:
        while True:
            i = self._pick()
            restarts_seen = self._restarts[i]
            self._in_flight[i] += 1
            self._owner[uid] = i
            try:
                group = await self.workers[i].generate_scored(row, n, uid, mode, score, partials, keep)
            except WorkerDied:
                if not self._restarted(i, restarts_seen):
                    raise
            else:
                for t in group.trajectories:
                    t.timings["engine"] = i  # the trace draws each engine's requests on its own track
                return group
            finally:
                self._in_flight[i] -= 1
                self._owner.pop(uid, None)

    def _ready(self) -> list[int]:
        """Workers taking groups now (not set aside until a weight sync)."""
        ready = [i for i in range(len(self.workers)) if i not in self._waiting_for_sync]
        if not ready:
            raise WorkerDied("every rollout worker died; the run stops")
        return ready

    def _pick(self) -> int:
        return min(self._ready(), key=lambda i: self._in_flight[i])

    def _restarted(self, i: int, restarts_seen: int) -> bool:
        """Worker i died: count a restart (once per death, however many groups saw it) and set
        it aside; False when it may not restart again."""
        if i in self._waiting_for_sync or self._restarts[i] != restarts_seen:
            return True  # another group saw this death first
        if self._restarts[i] >= self.max_restarts:
            return False
        self._restarts[i] += 1
        self._waiting_for_sync.add(i)
        self.log(f"rollout worker {i} died: restart {self._restarts[i]} of rollout.max_restarts={self.max_restarts}; "
                 "its groups go to the other workers until the next weight sync")
        return True

    def rejoin(self) -> None:
        """After a weight sync every worker has the run's weights: restarted ones take groups again."""
        self._waiting_for_sync.clear()

    async def score(self, groups: list[Group]) -> list[Group]:
        """Score in every ready worker's reward pool at once, a share of the groups each."""
        ready = self._ready()[: max(len(groups), 1)]
        parts = await asyncio.gather(*(self.workers[i].score(groups[k::len(ready)]) for k, i in enumerate(ready)))
        out = list(groups)
        for k, part in enumerate(parts):
            out[k::len(ready)] = part
        return out

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
        """Every worker's stats, summed (they are counts and rates), and the restarts."""
        total: dict[str, float] = {"rollout/worker_restarts": float(sum(self._restarts))}
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
    log: Callable[[str], None] = log_line
    tracker: Tracker | None = None
    total_steps: int = 0
    step: int = 0
    """Policy updates finished (and recorded in the prompt stream and the ledger)."""
    trained: int = 0
    """Groups trained by those updates."""
    training: bool = False
    """An update is running: its weights and its prompts do not agree until it ends."""
    resume_from: Path | None = None
    """The checkpoint this run starts from (`trainer.resume_mode`): never rewritten."""
    pipeline_state: Callable[[], dict[str, Any]] | None = None
    """The pipeline's own part of a checkpoint, taken at one instant (see `checkpoint.snapshot`)."""


def build_context(cfg: Config, *, log: Callable[[str], None] = log_line,
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
    router = RolloutRouter(workers.rollouts, cfg.rollout.max_restarts, log)
    sync = ParameterSynchronizer(workers.trainer, workers.rollouts, workers.transport, on_transfer=router.rejoin)
    prompts = PromptIterator(data.train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, output_dir=out, tokenizer=data.tokenizer, train_rows=data.train_rows,
                      val_rows=data.val_rows, prompts=prompts, rollout=router,
                      trainer=workers.trainer, synchronizer=sync,
                      trace=Trace(max_events=substrate.trace_max_events), ledger=SampleLedger(out / "samples.jsonl"),
                      stop=StopControl(cfg.trainer.stop_timeout_s, log), close=workers.close, log=log,
                      resume_from=resume_from)


def open_tracker(ctx: RunContext, initial_step: int) -> Tracker:
    t = ctx.cfg.trainer
    return make_tracker(t.logger, ctx.output_dir, total_steps=ctx.total_steps or t.total_training_steps,
                        initial_step=initial_step, project=t.project_name,
                        experiment=t.experiment_name, config=config_to_dict(ctx.cfg), log=ctx.log,
                        trace=ctx.trace)
