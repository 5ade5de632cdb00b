"""The processes substrate (`backend=processes`): the trainer and each rollout worker in its own
spawned process on this machine, no Ray.

This is how a decoupled run shares one GPU: the rollout process and the trainer process each
hold their model on it, the engine's KV cache is sized by `rollout.gpu_memory_utilization` and
the trainer's process is capped at the rest (`torch.cuda.set_per_process_memory_fraction`), and
weights move through one buffer shared by CUDA IPC (transport "ipc"). On a CPU the buffer is
shared memory, and each process runs its side's torch threads, as under Ray.

Each process builds its own model (`asyncrl.workers.factory`); calls reach it through
`ProcessHandle`. Not here: several machines, restarts, placement (use `backend=ray`).
"""

from __future__ import annotations

import functools
from typing import cast

import torch

from asyncrl.config_schema import Config
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.substrates import Log, RunData, Workers
from asyncrl.substrates.real import load_real_data, set_threads, worker_shares
from asyncrl.sync.transports import default_transport, make_transport
from asyncrl.workers.factory import build_rollout_server, build_trainer_side
from asyncrl.workers.handles import Proxy
from asyncrl.workers.process_host import ProcessHandle


def cap_gpu_memory(fraction: float) -> None:
    """In a worker process: use at most `fraction` of the GPU's memory."""
    torch.cuda.set_per_process_memory_fraction(fraction)


class ProcessSubstrate:
    trace_max_events = 2_000_000

    def __init__(self) -> None:
        self.handles: list[ProcessHandle] = []

    def load_data(self, cfg: Config, log: Log) -> RunData:
        set_threads(cfg.num_threads)
        return load_real_data(cfg, log)[2]

    def build_workers(self, cfg: Config, log: Log) -> Workers:
        shares = worker_shares(cfg)
        cuda = cfg.trainer.device == "cuda"
        trainer_setup = None
        if cuda and cfg.pipeline != "colocated":  # the engine keeps its fraction, the trainer the rest
            trainer_setup = functools.partial(cap_gpu_memory, 1.0 - cfg.rollout.gpu_memory_utilization)
        trainer_handle = ProcessHandle("trainer", functools.partial(build_trainer_side, cfg),
                                       num_threads=shares.trainer_threads, setup=trainer_setup)
        rollout_handles = [ProcessHandle(f"rollout worker {i}", functools.partial(build_rollout_server, cfg, i),
                                         num_threads=shares.rollout_threads)
                           for i in range(cfg.rollout.num_engines)]
        self.handles = [trainer_handle, *rollout_handles]
        trainer = cast(TrainerSide, Proxy(trainer_handle))
        rollouts = [cast(RolloutSide, Proxy(h)) for h in rollout_handles]
        transport = make_transport(default_transport("processes"), trainer, rollouts, self.handles,
                                   device=cfg.trainer.device)
        log(f"backend=processes: trainer and {len(rollouts)} rollout worker(s) in their own processes")
        return Workers(trainer, rollouts, transport, self.close)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles = []
