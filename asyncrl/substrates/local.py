"""The local substrate: every worker is an object in this process, sharing one model load.

Coroutine methods run on this event loop; torch work on compute threads (`asyncrl.compute`):
one that the engines and the trainer share in a colocated run, one per side in a decoupled run,
so there a training step overlaps generation. The loop's own thread then runs torch
single-threaded. Weights move in process.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.compute import compute_thread, pin_threads
from asyncrl.config.schema import Config
from asyncrl.roles import RolloutSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.substrates import Log, RunData, Workers
from asyncrl.substrates.real import load_real_data, side_cpus
from asyncrl.sync.transports import InProcessTransport
from asyncrl.workers.factory import build_rollout_server, build_trainer_side
from asyncrl.workers.handles import close_worker


class LocalSubstrate:
    trace_max_events = 2_000_000
    device: str | None = None

    def __init__(self) -> None:
        self._model: PreTrainedModel | None = None
        self._tok: PreTrainedTokenizerBase | None = None
        self._rollout_thread: ThreadPoolExecutor | None = None
        self._trainer_thread: ThreadPoolExecutor | None = None

    def load_data(self, cfg: Config, log: Log) -> RunData:
        rollout_cpus, trainer_cpus = side_cpus(cfg)
        self._rollout_thread = rollout = compute_thread(rollout_cpus, "asyncrl-rollout")
        self._trainer_thread = (rollout if cfg.pipeline == "colocated"
                                else compute_thread(trainer_cpus, "asyncrl-trainer"))
        pin_threads(1)  # this thread: an OpenMP team here would slow the compute threads'
        self._model, self._tok, data = rollout.submit(load_real_data, cfg, log).result()
        return data

    def build_workers(self, cfg: Config, plan: RunPlan, log: Log) -> Workers:
        model, tok, rollout, training = self._model, self._tok, self._rollout_thread, self._trainer_thread
        assert model is not None and tok is not None and rollout and training, "load_data first"
        rollouts: list[RolloutSide] = [
            rollout.submit(build_rollout_server, cfg, i, model, tok, compute=rollout).result()
            for i in range(cfg.rollout.num_engines)]
        trainer = training.submit(build_trainer_side, cfg, plan, model, tok, compute=training).result()

        def close() -> None:
            for worker in [*rollouts, trainer]:
                close_worker(worker)
            for thread in (rollout, training):
                thread.shutdown(wait=True)

        return Workers(trainer, rollouts, InProcessTransport(trainer, rollouts), close)
