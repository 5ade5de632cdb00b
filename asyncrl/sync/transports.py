"""How weights travel from the trainer worker to the rollout workers: four transports.

- "inprocess": the trainer's `export_weights()` dict is handed to every rollout's
  `load_weights` (the engine copies). Zero transport cost in one process; across processes it
  would relay through the driver, so use it with the local backend.
- "object_store" (Ray): the trainer's export is put into Ray's object store once, zero-copy
  (`RemoteProcess.tensors_ref`), and each rollout actor reads it from there; the driver only
  holds the reference. One node: shared memory; several nodes: Ray's object transfer.
- "broadcast" (Ray): a torch.distributed group of trainer (rank 0) + every rollout host,
  gloo on CPU, NCCL on GPU, buckets of ~`bucket_mb` MB planned once from the meta list.
- "ipc" (processes on one machine: the processes backend, or Ray on one node): one buffer on the
  trainer's device shared once with every rollout process, CUDA IPC on a GPU, shared memory on
  CPU (`asyncrl.sync.shared`); a sync is a copy in and a copy out.

Transports call the workers' role methods (`asyncrl.roles.WeightSource` / `WeightSink`); the
others also need each worker's process (`RemoteProcess`: run a function there; for the object
store, hand out a zero-copy reference), which the substrate passes in. `make_transport` checks that it can.
Not here: pausing, verification, timing (see `synchronizer`); tensor packing (`buckets`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from asyncrl.errors import ConfigError
from asyncrl.roles import WeightSink, WeightSource
from asyncrl.sync.buckets import DEFAULT_BUCKET_MB
from asyncrl.sync.collective import DEFAULT_TIMEOUT_S, cuda_available, destroy_collective, free_port, init_collective
from asyncrl.sync.rendezvous import new_store_path, remove_store
from asyncrl.sync.shared import attach_shared, close_shared, open_shared, shared_handles
from asyncrl.types import WeightMeta

TRANSPORTS = ("inprocess", "object_store", "broadcast", "ipc")


class Transport(Protocol):
    async def setup(self, meta: Sequence[WeightMeta]) -> None: ...

    async def transfer(self, version: int) -> None: ...

    async def close(self) -> None: ...


class RemoteProcess(Protocol):
    """A worker's process (`asyncrl.workers.ray_host.RayHandle`, `.process_host.ProcessHandle`)."""

    async def run(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """`fn(*args)` in that process (a module-level function, pickled by reference)."""
        ...

    async def node_ip(self) -> str: ...


class ObjectStoreProcess(RemoteProcess, Protocol):
    """A Ray actor's process: it can also leave a result in the object store."""

    def tensors_ref(self, method: str, /) -> Any:
        """Start `method` (returning `dict[str, Tensor]`); its result stays in the object store."""
        ...


def default_transport(backend: str, *, gpus: bool = False) -> str:
    """inprocess for the local backend, ipc for processes; for Ray, object_store on CPU,
    broadcast on GPUs.

    On CPU the object store moved a 135M-parameter model ~2x faster than gloo here
    (docs/weight_sync.md); on GPUs NCCL keeps the weights on the device."""
    if backend == "local":
        return "inprocess"
    if backend == "processes":
        return "ipc"
    return "broadcast" if gpus else "object_store"


class InProcessTransport:
    def __init__(self, trainer: WeightSource, rollouts: Sequence[WeightSink]) -> None:
        self.trainer, self.rollouts = trainer, list(rollouts)

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        pass

    async def transfer(self, version: int) -> None:
        named = await self.trainer.export_weights()
        await asyncio.gather(*(r.load_weights(named, version) for r in self.rollouts))

    async def close(self) -> None:
        pass


class ObjectStoreTransport:
    def __init__(self, trainer: ObjectStoreProcess, rollouts: Sequence[WeightSink]) -> None:
        self.trainer, self.rollouts = trainer, list(rollouts)

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        pass

    async def transfer(self, version: int) -> None:
        # a top-level argument of a remote call: Ray resolves it to the tensors in that process
        ref = cast(dict[str, Any], self.trainer.tensors_ref("export_weights"))
        await asyncio.gather(*(r.load_weights(ref, version) for r in self.rollouts))
        del ref  # the object store frees the export once no reference is left

    async def close(self) -> None:
        pass


class BroadcastTransport:
    def __init__(self, trainer: WeightSource, rollouts: Sequence[WeightSink],
                 processes: Sequence[RemoteProcess], *, bucket_mb: float = DEFAULT_BUCKET_MB,
                 backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"broadcast backend must be auto, gloo or nccl, got {backend!r}")
        self.trainer, self.rollouts = trainer, list(rollouts)
        self.processes = list(processes)  # trainer first, then the rollouts in order
        self.bucket_mb, self.backend, self.timeout_s = bucket_mb, backend, timeout_s
        self.group_name = f"asyncrl-sync-{uuid.uuid4().hex[:12]}"
        self.meta: list[WeightMeta] = []
        self._joined = False
        self._store = ""
        """The one-host FileStore's path (in a private directory the trainer's process made), if any."""

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        """Create the group: trainer = rank 0, rollout i = rank i + 1. On one host the members meet
        through a FileStore in a private directory the trainer's process makes (no TCP listener);
        across hosts through a TCPStore on the trainer's node address."""
        self.meta = list(meta)
        leader, members = self.processes[0], self.processes
        backend = self.backend
        if backend == "auto":
            backend = "nccl" if await leader.run(cuda_available) else "gloo"
        addr = await leader.node_ip()
        one_host = all([await h.node_ip() == addr for h in members[1:]])
        port = 0 if one_host else await leader.run(free_port)
        self._store = await leader.run(new_store_path) if one_host else ""
        await asyncio.gather(*(
            h.run(init_collective, self.group_name, rank, len(members), backend, addr, port,
                  self.timeout_s, self._store)
            for rank, h in enumerate(members)))
        self._joined = True

    async def transfer(self, version: int) -> None:
        name, mb = self.group_name, self.bucket_mb
        await asyncio.gather(
            self.trainer.broadcast_weights(name, mb),
            *(r.receive_weights(name, self.meta, version, mb) for r in self.rollouts))

    async def close(self) -> None:
        if self._joined:
            self._joined = False
            await asyncio.gather(*(h.run(destroy_collective, self.group_name) for h in self.processes),
                                 return_exceptions=True)
        if self._store:
            await self.processes[0].run(remove_store, self._store)
            self._store = ""


class SharedBufferTransport:
    def __init__(self, trainer: WeightSource, rollouts: Sequence[WeightSink],
                 processes: Sequence[RemoteProcess], device: str) -> None:
        self.trainer, self.rollouts = trainer, list(rollouts)
        self.processes = list(processes)  # trainer first, then the rollouts in order
        self.device = device
        self.name = f"asyncrl-shared-{uuid.uuid4().hex[:12]}"
        self.meta: list[WeightMeta] = []

    async def setup(self, meta: Sequence[WeightMeta]) -> None:
        """The trainer's process allocates the buffer on `device`; every rollout opens it."""
        self.meta = list(meta)
        trainer = self.processes[0]
        await trainer.run(open_shared, self.name, self.meta, self.device)
        for reader in self.processes[1:]:
            await reader.run(attach_shared, self.name, self.meta, await trainer.run(shared_handles, self.name))

    async def transfer(self, version: int) -> None:
        await self.trainer.broadcast_weights(self.name, 0.0)  # into the buffer, then the readers
        await asyncio.gather(*(r.receive_weights(self.name, self.meta, version, 0.0) for r in self.rollouts))

    async def close(self) -> None:
        await asyncio.gather(*(p.run(close_shared, self.name) for p in self.processes), return_exceptions=True)


def make_transport(name: str, trainer: WeightSource, rollouts: Sequence[WeightSink],
                   processes: Sequence[RemoteProcess] = (), *, bucket_mb: float = DEFAULT_BUCKET_MB,
                   collective_backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S,
                   device: str = "cpu") -> Transport:
    """The transport called `name`. All but inprocess need `processes`: the trainer's, then each
    rollout's (`RayHandle`s or `ProcessHandle`s), in the order of `rollouts`; ipc needs the
    trainer's `device`, object_store Ray's."""
    if name == "inprocess":
        return InProcessTransport(trainer, rollouts)
    if name not in TRANSPORTS:
        raise ConfigError(f"weight sync transport must be one of {TRANSPORTS}, got {name!r}")
    if len(processes) != 1 + len(rollouts):
        raise ConfigError(f"weight sync transport {name!r} needs workers in other processes "
                          "(backend ray or processes); use transport 'inprocess' with backend 'local'")
    if name == "ipc":
        return SharedBufferTransport(trainer, rollouts, processes, device)
    if name == "object_store":
        if not hasattr(processes[0], "tensors_ref"):
            raise ConfigError("weight sync transport 'object_store' needs backend=ray")
        return ObjectStoreTransport(cast(ObjectStoreProcess, processes[0]), rollouts)
    return BroadcastTransport(trainer, rollouts, processes, bucket_mb=bucket_mb,
                              backend=collective_backend, timeout_s=timeout_s)
