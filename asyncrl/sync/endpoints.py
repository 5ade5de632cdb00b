"""Reference trainer-side and rollout-side sync methods over a plain `nn.Module`.

`ParameterSynchronizer` calls these method names on the worker objects behind its handles.
A trainer or rollout worker can expose them by delegating to `TrainerWeights(model)` /
`RolloutWeights(model)` (the tests and `bench/weight_sync.py` use them directly); a rollout
worker also needs `async pause(interrupt)` and `async resume()` from its engine.

Trainer side:  weight_meta() · export_weights() · weights_checksum() · broadcast_weights(g, mb)
Rollout side:  load_weights(named, version) · weights_checksum() · receive_weights(g, meta, v, mb)

Not here: pausing engines, choosing a transport, timing (see `synchronizer`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from asyncrl.models.weights import load_into
from asyncrl.sync.buckets import DEFAULT_BUCKET_MB, recv_weights, send_weights
from asyncrl.sync.tensors import NamedTensors, WeightMeta, checksum, export_named, weight_meta


class TrainerWeights:
    """The trainer's half: describe, export, hash and broadcast its model's weights."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def weight_meta(self) -> list[WeightMeta]:
        return weight_meta(self.export_weights())

    def export_weights(self) -> dict[str, torch.Tensor]:
        return export_named(self.model)

    def weights_checksum(self) -> str:
        return checksum(self.export_weights())

    def broadcast_weights(self, group_name: str, bucket_mb: float = DEFAULT_BUCKET_MB) -> int:
        return send_weights(group_name, self.export_weights(), bucket_mb)


class RolloutWeights:
    """The rollout side's half: load (copying, in place), hash and receive weights."""

    def __init__(self, model: nn.Module, version: int = 0) -> None:
        self.model = model
        self.version = version

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        load_into(self.model, named_tensors)
        self.version = version

    def weights_checksum(self) -> str:
        return checksum(export_named(self.model))

    def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                        bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        self.load_weights(recv_weights(group_name, meta, bucket_mb), version)
