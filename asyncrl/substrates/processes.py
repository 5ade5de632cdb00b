"""The processes substrate (`backend=processes`): the trainer and each rollout worker in its own
spawned process on this machine, no Ray.

This is how a decoupled run shares one GPU: the rollout process and the trainer process each
hold their model on it, the engine's KV cache is sized by `rollout.gpu_memory_utilization` and
the trainer's process is capped at the rest (`torch.cuda.set_per_process_memory_fraction`), and
weights move through one buffer shared by CUDA IPC (transport "ipc"). On a CPU the buffer is
shared memory, and each process runs its side's torch threads, as under Ray.

`trainer.ranks` > 1: the trainer is that many processes, one process group (NCCL, rank r alone on
GPU r; gloo on CPU) in which the actor shards itself with FSDP2 (`asyncrl.training.fsdp`). The
ranks meet through a FileStore in a private directory, and gloo/NCCL listen on loopback only
(`asyncrl.sync.rendezvous`): no TCP listener on the host's network interfaces. The
pipeline sees them as one trainer (`RankGroup`): every call goes to every rank, in the same order
on each, so their collectives pair up, and rank 0 answers; rank 0 holds the shared weight buffer.

Each process builds its own model (`asyncrl.workers.factory`); calls reach it through
`ProcessHandle`. Not here: several machines, restarts, placement (use `backend=ray`).
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch
import torch.distributed as dist

from asyncrl.config.schema import Config
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.substrates import Log, RunData, Workers
from asyncrl.substrates.real import load_real_data, set_threads, worker_shares
from asyncrl.sync.rendezvous import LocalRendezvous, keep_local
from asyncrl.sync.transports import default_transport, make_transport
from asyncrl.workers.factory import build_rollout_server, build_trainer_side
from asyncrl.workers.handles import Proxy
from asyncrl.workers.process_host import ProcessHandle


def trainer_setup(rank: int, ranks: int, cuda: bool, memory_fraction: float) -> None:
    """In a trainer process, before anything touches CUDA: several ranks see one GPU each; the
    one sharing a GPU with the engine uses at most `memory_fraction` of it."""
    if cuda and ranks > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    if cuda and memory_fraction < 1.0:
        torch.cuda.set_per_process_memory_fraction(memory_fraction)


def trainer_rank(cfg: Config, plan: RunPlan, rank: int, store_path: str,
                 compute: ThreadPoolExecutor | None = None) -> TrainerSide:
    """Join the trainer's process group as `rank` (none for a single rank) through the FileStore at
    `store_path`, then build the trainer side: its actor shards itself in the group."""
    if cfg.trainer.ranks > 1:
        backend = "nccl" if cfg.trainer.device == "cuda" else "gloo"
        keep_local()
        dist.init_process_group(backend, store=dist.FileStore(store_path, cfg.trainer.ranks), rank=rank,
                                world_size=cfg.trainer.ranks)
    return build_trainer_side(cfg, plan, compute=compute)


class RankGroup:
    """The trainer's ranks as one worker (`Proxy(RankGroup(...))`): each call is sent to every
    rank in turn, so all ranks see the calls in the same order, and rank 0's answer is returned."""

    name = "trainer"

    def __init__(self, ranks: list[ProcessHandle]) -> None:
        self.ranks = ranks

    async def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        return (await asyncio.gather(*(r.call(method, *args, **kwargs) for r in self.ranks)))[0]


class ProcessSubstrate:
    trace_max_events = 2_000_000
    device: str | None = None

    def __init__(self) -> None:
        self.handles: list[ProcessHandle] = []
        self.rendezvous: LocalRendezvous | None = None

    def load_data(self, cfg: Config, log: Log) -> RunData:
        set_threads(cfg.num_threads)
        return load_real_data(cfg, log)[2]

    def build_workers(self, cfg: Config, plan: RunPlan, log: Log) -> Workers:
        shares = worker_shares(cfg)
        cuda, ranks = cfg.trainer.device == "cuda", cfg.trainer.ranks
        self.rendezvous = LocalRendezvous() if ranks > 1 else None
        store = self.rendezvous.path if self.rendezvous is not None else ""
        shared = 1.0 - cfg.rollout.gpu_memory_utilization if cfg.pipeline != "colocated" else 1.0
        trainer_handles = [  # rank 0 shares GPU 0 with the engine: it keeps the engine's fraction free
            ProcessHandle("trainer" if ranks == 1 else f"trainer rank {r}",
                          functools.partial(trainer_rank, cfg, plan, r, store), num_threads=shares.trainer_threads,
                          setup=functools.partial(trainer_setup, r, ranks, cuda, shared if r == 0 else 1.0))
            for r in range(ranks)]
        rollout_handles = [ProcessHandle(f"rollout worker {i}", functools.partial(build_rollout_server, cfg, i),
                                         num_threads=shares.rollout_threads)
                           for i in range(cfg.rollout.num_engines)]
        self.handles = [*trainer_handles, *rollout_handles]
        trainer = cast(TrainerSide, Proxy(RankGroup(trainer_handles) if ranks > 1 else trainer_handles[0]))
        rollouts = [cast(RolloutSide, Proxy(h)) for h in rollout_handles]
        transport = make_transport(default_transport("processes"), trainer, rollouts,
                                   [trainer_handles[0], *rollout_handles], device=cfg.trainer.device)
        log(f"backend=processes: {ranks} trainer and {len(rollouts)} rollout process(es)")
        return Workers(trainer, rollouts, transport, self.close)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles = []
        if self.rendezvous is not None:
            self.rendezvous.close()
            self.rendezvous = None
