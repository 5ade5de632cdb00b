"""The Ray substrate: each worker is a Ray actor placed on its resource pool.

Pools (placement groups, one bundle per node, `asyncrl.workers.ray_host.ResourcePool`):
- decoupled pipelines: "rollout" = rollout.nnodes x (rollout.num_cpus CPUs, rollout.n_gpus_per_node
  GPUs) shared by the rollout.num_engines rollout workers; "trainer" likewise from trainer.*;
- colocated: one "colocated" pool of num_threads cores (all by default), which the trainer and
  the rollout workers each reserve a share of but use whole, since they run one phase at a time.
A worker on a GPU pool takes one GPU. Each actor builds its own model (`asyncrl.workers.factory`).
Weights move through the object store on CPU, by NCCL broadcast on GPUs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar, cast

from asyncrl.config.schema import Config
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.scheduling.plan import RunPlan
from asyncrl.substrates import Log, RunData, Workers
from asyncrl.substrates.real import load_real_data, set_threads, side_cpus, worker_shares
from asyncrl.sync.transports import default_transport, make_transport
from asyncrl.workers.factory import build_rollout_server, build_trainer_side
from asyncrl.workers.handles import Proxy
from asyncrl.workers.ray_host import RayHandle, ResourcePool, init_ray

W = TypeVar("W")


class RaySubstrate:
    trace_max_events = 2_000_000
    device: str | None = None

    def __init__(self) -> None:
        self.handles: list[RayHandle] = []
        self.pools: list[ResourcePool] = []

    def load_data(self, cfg: Config, log: Log) -> RunData:
        init_ray(os.environ.get("RAY_ADDRESS"))
        set_threads(cfg.num_threads)
        return load_real_data(cfg, log)[2]

    def spawn(self, name: str, factory: Callable[[], W], pool: ResourcePool, *, cpus: float,
              threads: int, gpus: float = 0, max_restarts: int = 0) -> W:
        """`factory()` built inside a new actor on `pool`, seen as the worker it builds; Ray
        rebuilds it (up to `max_restarts` times) if its process dies."""
        handle = RayHandle(name, factory, num_cpus=cpus, num_gpus=gpus, num_threads=threads,
                           placement=pool.allocate(cpus, gpus), max_restarts=max_restarts)
        self.handles.append(handle)
        return cast(W, Proxy(handle))

    def build_workers(self, cfg: Config, plan: RunPlan, log: Log) -> Workers:
        rollout_pool, trainer_pool = self._pools(cfg)
        shares = worker_shares(cfg)
        gpu = 1.0 if cfg.trainer.device == "cuda" else 0.0
        rollouts: list[RolloutSide] = [
            self.spawn(f"rollout worker {i}", functools.partial(build_rollout_server, cfg, i), rollout_pool,
                       cpus=shares.rollout_cpus, threads=shares.rollout_threads, gpus=gpu,
                       max_restarts=cfg.rollout.max_restarts)
            for i in range(cfg.rollout.num_engines)]
        trainer: TrainerSide = self.spawn("trainer", functools.partial(build_trainer_side, cfg, plan), trainer_pool,
                                          cpus=shares.trainer_cpus, threads=shares.trainer_threads, gpus=gpu)
        processes = [self.handles[-1], *self.handles[:-1]]  # the trainer first, then rollouts in order
        transport = make_transport(default_transport("ray", gpus=bool(gpu)), trainer, rollouts, processes)
        return Workers(trainer, rollouts, transport, self.close)

    def _pools(self, cfg: Config) -> tuple[ResourcePool, ResourcePool]:
        if cfg.pipeline == "colocated":
            n = side_cpus(cfg)[0]
            pool = ResourcePool("colocated", 1, n, cfg.trainer.n_gpus_per_node,
                                keys=("num_threads", "trainer.n_gpus_per_node", "trainer.nnodes"))
            self.pools.append(pool)
            return pool, pool
        r, t = cfg.rollout, cfg.trainer
        rollout = ResourcePool("rollout", r.nnodes, max(1, r.num_cpus // r.nnodes), r.n_gpus_per_node)
        trainer = ResourcePool("trainer", t.nnodes, max(1, t.num_cpus // t.nnodes), t.n_gpus_per_node)
        self.pools += [rollout, trainer]
        return rollout, trainer

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        for pool in self.pools:
            pool.remove()
        self.handles, self.pools = [], []
