"""ParameterSynchronizer: push the trainer's weights to every rollout worker, timed and checked.

One sync:  pause(mode) on every rollout → transfer → every rollout has the weights and
`version` → [verify: each rollout's `weights_checksum()` == the trainer's] → resume().

It owns the run's **policy version**, the one meaning of "version" everywhere: the number of
times new trainer weights were published to the rollout side (verl's param version). `sync()`
publishes version + 1; `push(v)` sends the weights as version v without counting (a resumed run
pushes its checkpoint's weights once). `behind` says whether the trainer has updated since the
last transfer (pipelines set it when they train), so a checkpoint knows which version its
weights are.

The trainer must not change its weights during a sync (pipelines call it between updates).
If the transfer or the verification fails, the error propagates and the rollouts stay paused:
the run is meant to stop there, not to generate with half-loaded weights.

Not here: how bytes move (`transports`), what the workers do with them (`endpoints`), when to
sync (the pipelines and `scheduling/`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from asyncrl.errors import SyncError
from asyncrl.models.tensors import first_difference, meta_nbytes
from asyncrl.roles import PauseMode, WeightSink, WeightSource
from asyncrl.sync.transports import Transport
from asyncrl.telemetry import clock
from asyncrl.types import WeightMeta


class ParameterSynchronizer:
    """Weight sync from one trainer to a list of rollout workers over one transport."""

    def __init__(self, trainer: WeightSource, rollouts: Sequence[WeightSink], transport: Transport,
                 *, verify: bool = False, version: int = 0, on_transfer: Callable[[], None] | None = None) -> None:
        assert rollouts, "weight sync needs at least one rollout worker"
        self.trainer = trainer
        self.rollouts = list(rollouts)
        self.transport = transport
        self.verify = verify
        self.version = version
        self.behind = False
        """The trainer has updated since the last transfer (its weights are not `version`'s)."""
        self.transfers = 0
        """Transfers done (syncs and pushes): a resumed run pushes once, then one per sync."""
        self.meta: list[WeightMeta] | None = None
        self.nbytes = 0
        self.on_transfer = on_transfer
        """Called after each transfer: every rollout worker then holds `version`'s weights."""

    async def setup(self) -> None:
        """Once: the trainer's (name, shape, dtype) list, then the transport (e.g. its group)."""
        raw = await self.trainer.weight_meta()
        self.meta = [(str(n), tuple(int(d) for d in shape), str(dt)) for n, shape, dt in raw]
        self.nbytes = meta_nbytes(self.meta)
        await self.transport.setup(self.meta)

    async def sync(self, *, interrupt: bool = False) -> dict[str, float]:
        """Publish the trainer's weights as version + 1. With `interrupt` (partial rollout) the
        rollouts' requests in flight are interrupted and continue under the new weights."""
        return await self._transfer(self.version + 1, "abort" if interrupt else "keep")

    async def push(self, version: int) -> dict[str, float]:
        """Send the trainer's weights as `version` without counting a new one (resume)."""
        return await self._transfer(version, "keep")

    async def _transfer(self, version: int, mode: PauseMode) -> dict[str, float]:
        """Pause → transfer → load + version → [verify] → resume; returns timings and sizes."""
        if self.meta is None:
            await self.setup()
        marks = [clock.now()]
        await asyncio.gather(*(r.pause(mode) for r in self.rollouts))
        marks.append(clock.now())
        await self.transport.transfer(version)
        marks.append(clock.now())
        if self.verify:
            await self._verify(version)
        marks.append(clock.now())
        await asyncio.gather(*(r.resume() for r in self.rollouts))
        marks.append(clock.now())
        self.version = version
        self.behind = False
        self.transfers += 1
        if self.on_transfer is not None:
            self.on_transfer()
        return self._metrics(marks, version)

    async def close(self) -> None:
        await self.transport.close()

    async def _verify(self, version: int) -> None:
        expected, *actual = await asyncio.gather(
            self.trainer.weights_checksum(), *(r.weights_checksum() for r in self.rollouts))
        for i, got in enumerate(actual):
            name = first_difference(expected, got)
            if name is not None:
                raise SyncError(f"weight sync (version {version}, {type(self.transport).__name__}) "
                                f"to rollout worker {i}: tensor {name!r} differs from the trainer's")

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
