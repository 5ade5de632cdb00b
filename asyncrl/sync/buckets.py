"""Bucketed broadcast of named weights over a sync group: the two halves of the transfer.

The (name, shape, dtype) list is cut once into buckets of about `bucket_mb` MB, one dtype per
bucket, in export order; a tensor larger than a bucket travels alone. Per sync the sender
flattens each bucket into one of two reusable buffers (filling the next while the previous is
on the wire) and broadcasts it from rank 0; a receiver gets each bucket into a fresh flat
buffer and hands back views of it, named, in export order (no copy after the wire).

The first transfer of a group checks that every member built the same plan (a hash of the
meta all-reduced), so a sender and a receiver that disagree fail with `SyncError` instead of
exchanging garbage or hanging.

Not here: the group itself (`collective`), loading the received tensors into a model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asyncrl.errors import SyncError
from asyncrl.models.tensors import to_dtype, weight_meta
from asyncrl.sync.collective import Collective, broadcast, get_collective, same_on_all_ranks
from asyncrl.sync.shared import recv_shared, send_shared, shared_channel
from asyncrl.types import WeightMeta

DEFAULT_BUCKET_MB = 64.0


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int  # in elements of the bucket's dtype
    numel: int


@dataclass(frozen=True)
class Bucket:
    dtype: torch.dtype
    slots: tuple[Slot, ...]
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def plan_buckets(meta: Sequence[WeightMeta], bucket_mb: float) -> list[Bucket]:
    """Buckets of at most `bucket_mb` MB (or one oversized tensor), one dtype each."""
    assert bucket_mb > 0, "bucket_mb must be positive"
    limit = int(bucket_mb * 2**20)
    by_dtype: dict[str, list[WeightMeta]] = {}
    for entry in meta:
        by_dtype.setdefault(entry[2], []).append(entry)
    buckets: list[Bucket] = []
    for dtype_str, entries in by_dtype.items():
        buckets.extend(_fill(to_dtype(dtype_str), entries, limit))
    return buckets


def _fill(dtype: torch.dtype, entries: list[WeightMeta], limit: int) -> list[Bucket]:
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    used = 0
    for name, shape, _ in entries:
        numel = int(torch.Size(shape).numel())
        if slots and (used + numel) * dtype.itemsize > limit:
            buckets.append(Bucket(dtype, tuple(slots), used))
            slots, used = [], 0
        slots.append(Slot(name, tuple(shape), used, numel))
        used += numel
    if slots:
        buckets.append(Bucket(dtype, tuple(slots), used))
    return buckets


def meta_fingerprint(meta: Sequence[WeightMeta], bucket_mb: float) -> int:
    rows = [(str(name), tuple(int(d) for d in shape), str(dtype)) for name, shape, dtype in meta]
    text = repr((rows, float(bucket_mb))).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=7).digest(), "big")


def _check_plan(group: Collective, meta: Sequence[WeightMeta], bucket_mb: float) -> None:
    if not same_on_all_ranks(group, meta_fingerprint(meta, bucket_mb)):
        raise SyncError(f"sync group {group.name!r}: the trainer's weight list (or bucket_mb) "
                        "differs from a rollout's; trainer weight_meta() must describe "
                        "export_weights() exactly")


class BroadcastSender:
    """Rank 0's half: broadcasts named tensors bucket by bucket, double-buffered."""

    def __init__(self, meta: Sequence[WeightMeta], bucket_mb: float, group: Collective) -> None:
        self.meta = list(meta)
        self.bucket_mb = bucket_mb
        self.group = group
        self.buckets = plan_buckets(self.meta, bucket_mb)
        size = max((b.nbytes for b in self.buckets if len(b.slots) > 1), default=0)
        self._raw = [torch.empty(size, dtype=torch.uint8, device=group.device) for _ in range(2)]
        self._checked = False

    def send(self, named: Mapping[str, torch.Tensor]) -> int:
        """Broadcast every tensor of `named` (keys and shapes as in `meta`); returns bytes."""
        if not self._checked:
            _check_plan(self.group, self.meta, self.bucket_mb)
            self._checked = True
        pending: list[dist.Work | None] = [None, None]
        for i, bucket in enumerate(self.buckets):
            k = i % 2
            previous = pending[k]
            if previous is not None:
                previous.wait()  # its buffer is about to be refilled
            pending[k] = broadcast(self.group, self._flat(bucket, named, k))
        for work in pending:
            if work is not None:
                work.wait()
        return sum(b.nbytes for b in self.buckets)

    def _flat(self, bucket: Bucket, named: Mapping[str, torch.Tensor], k: int) -> torch.Tensor:
        if len(bucket.slots) == 1:  # one tensor: send it as it is when it can go on the wire
            t = named[bucket.slots[0].name].detach()
            if t.device == self.group.device and t.is_contiguous():
                return t.reshape(-1)
            return t.reshape(-1).to(self.group.device)
        flat = self._raw[k][: bucket.nbytes].view(bucket.dtype)
        for slot in bucket.slots:
            t = named[slot.name]
            assert t.dtype == bucket.dtype and t.numel() == slot.numel, f"{slot.name} changed"
            flat[slot.offset: slot.offset + slot.numel].copy_(t.detach().reshape(-1))
        return flat


class BroadcastReceiver:
    """A rollout rank's half: receives every bucket, returns named views in export order."""

    def __init__(self, meta: Sequence[WeightMeta], bucket_mb: float, group: Collective) -> None:
        self.meta = list(meta)
        self.bucket_mb = bucket_mb
        self.group = group
        self.buckets = plan_buckets(self.meta, bucket_mb)
        self._checked = False

    def receive(self) -> dict[str, torch.Tensor]:
        if not self._checked:
            _check_plan(self.group, self.meta, self.bucket_mb)
            self._checked = True
        views: dict[str, torch.Tensor] = {}
        works = []
        for bucket in self.buckets:
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=self.group.device)
            works.append(broadcast(self.group, flat))
            for s in bucket.slots:
                views[s.name] = flat[s.offset: s.offset + s.numel].view(s.shape)
        for work in works:
            work.wait()
        return {name: views[name] for name, _, _ in self.meta}


def send_weights(group_name: str, named: Mapping[str, torch.Tensor],
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> int:
    """Trainer side of a broadcast sync (rank 0 of `group_name`); the plan is cached. A shared
    buffer of that name (`asyncrl.sync.shared`) takes the weights instead."""
    channel = shared_channel(group_name)
    if channel is not None:
        return send_shared(channel, named)
    group = get_collective(group_name)
    key = ("sender", bucket_mb)
    if key not in group.cache:
        group.cache[key] = BroadcastSender(weight_meta(named), bucket_mb, group)
    return group.cache[key].send(named)


def recv_weights(group_name: str, meta: Sequence[WeightMeta],
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> dict[str, torch.Tensor]:
    """Rollout side of a broadcast sync: the trainer's tensors, on the group's device (views of
    the shared buffer of that name, if this process has one)."""
    channel = shared_channel(group_name)
    if channel is not None:
        return recv_shared(channel)
    group = get_collective(group_name)
    key = ("receiver", bucket_mb)
    if key not in group.cache:
        group.cache[key] = BroadcastReceiver(meta, bucket_mb, group)
    return group.cache[key].receive()
