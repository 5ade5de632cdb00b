"""The local substrate: every worker is an object in this process, sharing one model load.

Coroutine methods run on this event loop; `@blocking` ones (training, checkpoints) on the
worker's own thread, so a training step overlaps generation. Weights move in process.
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.config_schema import Config
from asyncrl.roles import RolloutSide
from asyncrl.substrates import Log, RunData, Workers
from asyncrl.substrates.real import load_real_data, set_threads, side_cpus
from asyncrl.sync.transports import InProcessTransport
from asyncrl.workers.factory import build_rollout_server, build_trainer_side
from asyncrl.workers.handles import close_worker


class LocalSubstrate:
    trace_max_events = 2_000_000

    def __init__(self) -> None:
        self._model: PreTrainedModel | None = None
        self._tok: PreTrainedTokenizerBase | None = None

    def load_data(self, cfg: Config, log: Log) -> RunData:
        self._model, self._tok, data = load_real_data(cfg, log)
        return data

    def build_workers(self, cfg: Config, log: Log) -> Workers:
        assert self._model is not None and self._tok is not None, "load_data first"
        rollout_cpus, trainer_cpus = side_cpus(cfg)
        set_threads(rollout_cpus)  # this loop's thread runs the engines' step threads' setup
        rollouts: list[RolloutSide] = [build_rollout_server(cfg, i, self._model, self._tok)
                                       for i in range(cfg.rollout.num_engines)]
        trainer = build_trainer_side(cfg, self._model, self._tok, num_threads=trainer_cpus)

        def close() -> None:
            for worker in [*rollouts, trainer]:
                close_worker(worker)

        return Workers(trainer, rollouts, InProcessTransport(trainer, rollouts), close)
