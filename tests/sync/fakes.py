"""Named fakes for weight-sync tests: a tiny mixed-dtype tied model, a trainer and rollouts.

`RecordingRollout` logs pause/load/resume in order and can corrupt its next load;
`FakeTrainer` can perturb its weights so a second sync has something new to deliver.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from asyncrl.roles import PauseMode
from asyncrl.sync import RolloutWeights, TrainerWeights
from asyncrl.types import NamedTensors, WeightMeta


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


class FakeTrainer(TrainerWeights):
    """A `WeightSource` over a small model that can change its weights."""

    def __init__(self, seed: int = 0) -> None:
        torch.set_num_threads(1)
        super().__init__(small_model(seed))

    async def perturb(self, scale: float = 0.01) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn_like(p) * scale)


class RecordingRollout(RolloutWeights):
    """A `WeightSink` that logs pause/load/resume in order and can corrupt its next load."""

    def __init__(self, seed: int = 1) -> None:
        torch.set_num_threads(1)
        super().__init__(small_model(seed))
        self.events: list[str] = []
        self.corrupt_name: str | None = None

    async def pause(self, mode: PauseMode = "keep") -> None:
        self.events.append(f"pause({mode})")

    async def resume(self) -> None:
        self.events.append("resume")

    async def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        await super().load_weights(named_tensors, version)
        self.events.append(f"load v{version}")
        if self.corrupt_name is not None:
            param = dict(self.model.named_parameters())[self.corrupt_name]
            with torch.no_grad():
                flat = param.view(-1)
                flat[0] = flat[0] + 1.0
            self.corrupt_name = None

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float) -> None:
        self.events.append("receive")
        await super().receive_weights(group_name, meta, version, bucket_mb)

    async def corrupt_next_load(self, name: str) -> None:
        self.corrupt_name = name

    async def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events

    async def get_version(self) -> int:
        return self.version
