"""ParameterSynchronizer: push the trainer's weights to every rollout worker, timed and checked.

One sync:  pause(interrupt) on every rollout → transfer → every rollout has the weights and
`version` → [verify: each rollout's `weights_checksum()` == the trainer's] → resume().

The trainer must not change its weights during a sync (pipelines call it between updates).
If the transfer or the verification fails, the error propagates and the rollouts stay paused:
the run is meant to stop there, not to generate with half-loaded weights.

Not here: how bytes move (`transports`), what the workers do with them (`endpoints`), when to
sync (the pipelines and `scheduling/`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from asyncrl.errors import SyncError
from asyncrl.sync.buckets import DEFAULT_BUCKET_MB
from asyncrl.sync.collective import DEFAULT_TIMEOUT_S
from asyncrl.sync.tensors import WeightMeta, first_difference, meta_nbytes
from asyncrl.sync.transports import Transport, make_transport
from asyncrl.telemetry import clock
from asyncrl.workers.group import WorkerHandle


class ParameterSynchronizer:
    """Weight sync from one trainer handle to a list of rollout handles over one transport."""

    def __init__(self, trainer: WorkerHandle, rollouts: Sequence[WorkerHandle], transport: str | Transport,
                 *, verify: bool = False, bucket_mb: float = DEFAULT_BUCKET_MB,
                 collective_backend: str = "auto",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        assert rollouts, "weight sync needs at least one rollout worker"
        self.trainer = trainer
        self.rollouts = list(rollouts)
        self.transport_name = transport if isinstance(transport, str) else type(transport).__name__
        self.verify = verify
        self.transport: Transport = transport if not isinstance(transport, str) else make_transport(
            transport, trainer, self.rollouts, bucket_mb=bucket_mb,
            collective_backend=collective_backend, timeout_s=timeout_s)
        self.meta: list[WeightMeta] | None = None
        self.nbytes = 0

    async def setup(self) -> None:
        """Once: the trainer's (name, shape, dtype) list, then the transport (e.g. its group)."""
        raw = await self.trainer.call("weight_meta")
        self.meta = [(str(n), tuple(int(d) for d in shape), str(dt)) for n, shape, dt in raw]
        self.nbytes = meta_nbytes(self.meta)
        await self.transport.setup(self.meta)

    async def sync(self, version: int, *, interrupt: bool = False) -> dict[str, float]:
        """Pause → transfer → load + version → [verify] → resume; returns timings and sizes."""
        if self.meta is None:
            await self.setup()
        marks = [clock.now()]
        await asyncio.gather(*(r.call("pause", interrupt) for r in self.rollouts))
        marks.append(clock.now())
        await self.transport.transfer(version)
        marks.append(clock.now())
        if self.verify:
            await self._verify(version)
        marks.append(clock.now())
        await asyncio.gather(*(r.call("resume") for r in self.rollouts))
        marks.append(clock.now())
        return self._metrics(marks, version)

    async def close(self) -> None:
        await self.transport.close()

    async def _verify(self, version: int) -> None:
        expected, *actual = await asyncio.gather(
            self.trainer.call("weights_checksum"),
            *(r.call("weights_checksum") for r in self.rollouts))
        for handle, got in zip(self.rollouts, actual):
            name = first_difference(expected, got)
            if name is not None:
                raise SyncError(f"weight sync (version {version}, transport "
                                f"{self.transport_name!r}) to {handle.name}: tensor {name!r} "
                                "differs from the trainer's")

    def _metrics(self, marks: list[float], version: int) -> dict[str, float]:
        pause, transfer, verify, resume = (b - a for a, b in zip(marks, marks[1:]))
        return {
            "timing_s/param_sync": marks[-1] - marks[0],
            "sync/pause_s": pause,
            "sync/transfer_s": transfer,
            "sync/verify_s": verify,
            "sync/resume_s": resume,
            "sync/bytes": float(self.nbytes),
            "sync/gb_per_s": self.nbytes / transfer / 1e9 if transfer > 0 else 0.0,
            "sync/num_rollouts": float(len(self.rollouts)),
            "sync/version": float(version),
        }
