"""Weight sync between processes on one machine through one shared buffer: a CUDA IPC handle on
a GPU, shared memory on the CPU. The "ipc" transport (`transports.SharedBufferTransport`).

The trainer's process allocates one flat buffer per dtype on its device, laid out once from the
(name, shape, dtype) list, and every rollout process opens it once: `open_shared` returns the
buffers pickled by torch's multiprocessing reducer (an IPC handle per CUDA buffer, a file
descriptor per shared-memory one, which can be received once: so one `shared_handles` per
reader), `attach_shared` opens them. From then on a sync is two
copies and no pickling: the trainer writes its export into the buffer and waits for the device
(`send_shared`), then each rollout's engine copies from its views of it (`recv_shared`). The
transport runs the two halves one after the other, so no reader sees a half-written buffer, and
a weight load returns only once its copies are done (`asyncrl.models.weights.load_into`), so
the next write cannot overtake a read.

A channel is registered per process under the sync group's name, as a collective is
(`collective`), and `send_weights` / `recv_weights` (`buckets`) look here first, so the same
role methods (`broadcast_weights` / `receive_weights`) serve both transports.

Not here: the processes (`asyncrl.workers.process_host`), choosing the transport.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import torch

from asyncrl.errors import SyncError
from asyncrl.models.tensors import to_dtype
from asyncrl.types import WeightMeta


@dataclass
class SharedChannel:
    """One process's view of a shared weight buffer: a view per tensor, in export order."""

    name: str
    buffers: list[torch.Tensor]
    views: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


_CHANNELS: dict[str, SharedChannel] = {}
_LOCK = threading.Lock()


def _sizes(meta: Sequence[WeightMeta]) -> dict[str, int]:
    """Elements per dtype, in order of first appearance: one buffer each."""
    sizes: dict[str, int] = {}
    for _, shape, dtype in meta:
        sizes[dtype] = sizes.get(dtype, 0) + int(torch.Size(shape).numel())
    return sizes


def _register(name: str, meta: Sequence[WeightMeta], buffers: list[torch.Tensor]) -> None:
    sizes = _sizes(meta)
    if [(to_dtype(d), n) for d, n in sizes.items()] != [(t.dtype, t.numel()) for t in buffers]:
        raise SyncError(f"shared weights {name!r}: the buffers do not match the weight list")
    flat = dict(zip(sizes, buffers))
    used = dict.fromkeys(sizes, 0)
    views: dict[str, torch.Tensor] = {}
    for tensor_name, shape, dtype in meta:
        numel = int(torch.Size(shape).numel())
        views[tensor_name] = flat[dtype][used[dtype]: used[dtype] + numel].view(shape)
        used[dtype] += numel
    with _LOCK:
        if name in _CHANNELS:
            raise SyncError(f"this process already has shared weights {name!r}")
        _CHANNELS[name] = SharedChannel(name, buffers, views)


def open_shared(name: str, meta: Sequence[WeightMeta], device: str) -> None:
    """Trainer side, once: allocate the buffers on `device`."""
    buffers = [torch.empty(n, dtype=to_dtype(d), device=device) for d, n in _sizes(meta).items()]
    if torch.device(device).type == "cpu":
        buffers = [b.share_memory_() for b in buffers]
    _register(name, meta, buffers)


def shared_handles(name: str) -> bytes:
    """Trainer side, once per reader: the buffers, pickled for one `attach_shared`."""
    channel = shared_channel(name)
    if channel is None:
        raise SyncError(f"this process has no shared weights {name!r}; open_shared first")
    return bytes(ForkingPickler.dumps(channel.buffers))


def attach_shared(name: str, meta: Sequence[WeightMeta], handles: bytes) -> None:
    """Rollout side, once: open the trainer's buffers (the trainer's process must be alive)."""
    _register(name, meta, pickle.loads(handles))


def shared_channel(name: str) -> SharedChannel | None:
    with _LOCK:
        return _CHANNELS.get(name)


def send_shared(channel: SharedChannel, named: Mapping[str, torch.Tensor]) -> int:
    """Copy the export into the buffer and wait for the device; returns the bytes written."""
    if list(named) != list(channel.views):
        raise SyncError(f"shared weights {channel.name!r}: the export's names differ from the "
                        "weight list the channel was opened with")
    with torch.no_grad():
        for name, tensor in named.items():
            channel.views[name].copy_(tensor)
    for buf in channel.buffers:
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)
    return channel.nbytes


def recv_shared(channel: SharedChannel) -> dict[str, torch.Tensor]:
    """Named views of the buffer (the weight load copies from them)."""
    return dict(channel.views)


def close_shared(name: str) -> None:
    """Drop this process's channel (no-op if none); the memory goes with the last process holding it."""
    with _LOCK:
        _CHANNELS.pop(name, None)
