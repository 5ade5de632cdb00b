"""Standalone torch.distributed groups for weight broadcast, registered by name per process.

A sync group (trainer rank 0 + one rank per rollout host) is its own `ProcessGroupGloo` (CPU)
or `ProcessGroupNCCL` (GPU), not the default process group: the trainer may already belong to an
FSDP world, and `init_process_group` can run once per process. Its members meet through a
`FileStore` in a private directory when they share one host (`store_path`; gloo and NCCL then
listen on loopback, `rendezvous.keep_local`), else through a `TCPStore` on rank 0's address
(multi-node: it listens on all interfaces, unauthenticated; docs/reliability.md says what to
firewall).
Every member calls `init_collective` with the same name, world size and address at the same
time (it blocks until all have joined); afterwards code in that process finds the group with
`get_collective(name)`.

Not here: what is sent (see `buckets`), choosing ranks or addresses (see `transports`).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asyncrl.errors import ConfigError, SyncError
from asyncrl.sync.rendezvous import keep_local

DEFAULT_TIMEOUT_S = 600.0
"""How long a member waits for the others (at setup and inside each broadcast)."""


@dataclass
class Collective:
    """One process's membership of a named sync group."""

    name: str
    rank: int
    world_size: int
    backend: str
    device: torch.device
    pg: Any
    store: Any
    cache: dict[Any, Any] = field(default_factory=dict)
    """Per-group state built once (bucket plans and buffers of senders/receivers)."""


_GROUPS: dict[str, Collective] = {}
_LOCK = threading.Lock()


def init_collective(group_name: str, rank: int, world_size: int, backend: str,
                    master_addr: str, master_port: int,
                    timeout_s: float = DEFAULT_TIMEOUT_S, store_path: str = "") -> None:
    """Join group `group_name` as `rank`: through the FileStore at `store_path` (one host), else
    the TCPStore rank 0 hosts at `master_addr:master_port`."""
    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"collective backend must be 'gloo' or 'nccl', got {backend!r}")
    with _LOCK:
        if group_name in _GROUPS:
            raise SyncError(f"this process already belongs to sync group {group_name!r}")
    timeout = timedelta(seconds=timeout_s)
    store: dist.Store
    if store_path:
        keep_local()
        store = dist.FileStore(store_path, world_size)
    else:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    pg: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        device = torch.device("cpu")
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    with _LOCK:
        _GROUPS[group_name] = Collective(group_name, rank, world_size, backend, device, pg, store)


def get_collective(group_name: str) -> Collective:
    with _LOCK:
        group = _GROUPS.get(group_name)
    if group is None:
        raise SyncError(f"this process has not joined sync group {group_name!r}; "
                        "call ParameterSynchronizer.setup() first")
    return group


def destroy_collective(group_name: str) -> None:
    """Leave the group (no-op if not a member); its buffers are freed."""
    with _LOCK:
        group = _GROUPS.pop(group_name, None)
    if group is not None:
        shutdown = getattr(group.pg, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # leaving is best effort; the group is unusable either way
                pass
        group.cache.clear()


def broadcast(group: Collective, tensor: torch.Tensor, src: int = 0) -> dist.Work:
    """Start a broadcast of `tensor` from rank `src`; returns the work handle (`.wait()`)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    return group.pg.broadcast([tensor], opts)


def same_on_all_ranks(group: Collective, value: int) -> bool:
    """True when every member passed the same int (a min and a max all-reduce)."""
    out = []
    for op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        t = torch.tensor([value], dtype=torch.int64, device=group.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(op)
        group.pg.allreduce([t], opts).wait()
        out.append(int(t.item()))
    return out[0] == out[1] == value


def free_port() -> int:
    """A TCP port free on every interface of this host right now (for a multi-node TCPStore);
    the socket is closed at once, it never listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def cuda_available() -> bool:
    return torch.cuda.is_available()
