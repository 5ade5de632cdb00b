"""Named fakes for weight-sync tests: a tiny mixed-dtype tied model, a trainer and rollouts.

`RecordingRollout` logs pause/load/resume in order and can corrupt its next load;
`FakeTrainer` can perturb its weights so a second sync has something new to deliver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch
from torch import nn

from asyncrl.roles import PauseMode
from asyncrl.sync import RolloutWeights, TrainerWeights, WeightMeta, recv_weights
from asyncrl.sync.tensors import NamedTensors


class TiedLM(nn.Module):
    """Embedding tied to the output head, fp32 and bf16 layers; no transformers import (every
    Ray actor would pay seconds for it)."""

    def __init__(self, vocab: int = 103, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList([nn.Linear(hidden, 2 * hidden),
                                     nn.Linear(2 * hidden, hidden, bias=False)])
        self.blocks[1].to(torch.bfloat16)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight


def small_model(seed: int) -> TiedLM:
    torch.manual_seed(seed)
    return TiedLM()


class FakeTrainer:
    """A `WeightSource` over a small model."""

    def __init__(self, seed: int = 0) -> None:
        torch.set_num_threads(1)
        self.weights = TrainerWeights(small_model(seed))

    async def weight_meta(self) -> list[WeightMeta]:
        return self.weights.weight_meta()

    async def export_weights(self) -> dict[str, torch.Tensor]:
        return self.weights.export_weights()

    async def broadcast_weights(self, group_name: str, bucket_mb: float) -> int:
        return await asyncio.to_thread(self.weights.broadcast_weights, group_name, bucket_mb)

    async def weights_checksum(self) -> str:
        return self.weights.weights_checksum()

    async def perturb(self, scale: float = 0.01) -> None:
        with torch.no_grad():
            for p in self.weights.model.parameters():
                p.add_(torch.randn_like(p) * scale)


class RecordingRollout:
    """A `WeightSink` that logs pause/load/resume in order and can corrupt its next load."""

    def __init__(self, seed: int = 1) -> None:
        torch.set_num_threads(1)
        self.weights = RolloutWeights(small_model(seed))
        self.events: list[str] = []
        self.corrupt_name: str | None = None

    @property
    def version(self) -> int:
        return self.weights.version

    async def pause(self, mode: PauseMode = "keep") -> None:
        self.events.append(f"pause({mode})")

    async def resume(self) -> None:
        self.events.append("resume")

    async def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self._load(named_tensors, version)

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float) -> None:
        self.events.append("receive")
        self._load(await asyncio.to_thread(recv_weights, group_name, meta, bucket_mb), version)

    async def weights_checksum(self) -> str:
        return self.weights.weights_checksum()

    async def corrupt_next_load(self, name: str) -> None:
        self.corrupt_name = name

    async def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events

    async def get_version(self) -> int:
        return self.version

    def _load(self, named_tensors: NamedTensors, version: int) -> None:
        self.weights.load_weights(named_tensors, version)
        self.events.append(f"load v{version}")
        if self.corrupt_name is not None:
            param = dict(self.weights.model.named_parameters())[self.corrupt_name]
            with torch.no_grad():
                flat = param.view(-1)
                flat[0] = flat[0] + 1.0
            self.corrupt_name = None
