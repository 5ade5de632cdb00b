"""Both halves of weight sync over a plain `nn.Module`, as the roles the synchronizer calls.

`TrainerWeights(model)` is an `asyncrl.roles.WeightSource`; `RolloutWeights(model)` a
`WeightSink` whose pause/resume do nothing (it has no engine to stop). Workers delegate to
them (`PPOTrainer`), and tests and `bench/weight_sync.py` use them as they are.

Not here: pausing engines, choosing a transport, timing (see `synchronizer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.models.tensors import checksum, export_named, weight_meta
from asyncrl.models.weights import load_into
from asyncrl.roles import PauseMode
from asyncrl.sync.buckets import DEFAULT_BUCKET_MB, recv_weights, send_weights
from asyncrl.types import NamedTensors, WeightMeta


class TrainerWeights:
    """The trainer's half: describe, export, hash and broadcast its model's weights.

    `export` replaces `export_named(model)` where the engines' weights are computed from the
    trained ones (a LoRA actor's `named_weights`: merged, under the base names)."""

    def __init__(self, model: nn.Module, export: Callable[[], dict[str, torch.Tensor]] | None = None) -> None:
        self.model = model
        self._export = export or (lambda: export_named(model))

    async def weight_meta(self) -> list[WeightMeta]:
        return weight_meta(self._export())

    async def export_weights(self) -> dict[str, torch.Tensor]:
        return self._export()

    async def weights_checksum(self) -> str:
        return await asyncio.to_thread(lambda: checksum(self._export()))

    async def broadcast_weights(self, group_name: str, bucket_mb: float = DEFAULT_BUCKET_MB) -> int:
        return await asyncio.to_thread(self._send, group_name, bucket_mb)

    def _send(self, group_name: str, bucket_mb: float) -> int:
        named = self._export()  # a sharded trainer's ranks all gather the full tensors ...
        if dist.is_initialized() and dist.get_rank() > 0:
            return 0  # ... and rank 0 sends them
        return send_weights(group_name, named, bucket_mb)


class RolloutWeights:
    """The rollout side's half: load (copying, in place), hash and receive weights."""

    def __init__(self, model: nn.Module, version: int = 0) -> None:
        self.model = model
        self.version = version

    async def pause(self, mode: PauseMode = "keep") -> None:
        pass

    async def resume(self) -> None:
        pass

    async def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        load_into(self.model, named_tensors)
        self.version = version

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        await self.load_weights(await asyncio.to_thread(recv_weights, group_name, meta, bucket_mb), version)

    async def weights_checksum(self) -> str:
        return checksum(export_named(self.model))
