"""Workers for the host tests (Ray, processes): one that reports where and how its methods run,
and the two halves of a weight sync over a small model."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import torch

from asyncrl.errors import ConfigError, SyncError
from asyncrl.sync.endpoints import RolloutWeights, TrainerWeights
from asyncrl.workers.handles import blocking


class Probe:
    """Reports where and how its methods run."""

    def __init__(self, tag: str = "probe", marker: str | None = None) -> None:
        self.tag = tag
        self.marker = marker

    def close(self) -> None:
        """Leaves `marker` behind: what a test in another process can see."""
        if self.marker:
            Path(self.marker).write_text("closed")

    async def wait_cancelled(self, marker: str) -> None:
        """Sleeps until cancelled, then leaves `marker` behind."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            Path(marker).write_text("cancelled")
            raise

    async def where_async(self) -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    @blocking
    def where_blocking(self) -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    async def sleep_echo(self, i: int, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return i

    @blocking
    def block(self, seconds: float) -> float:
        time.sleep(seconds)
        return time.monotonic()

    async def now(self) -> float:
        return time.monotonic()

    def fail_plain(self) -> None:
        raise ValueError("plain failure")

    async def fail_async(self) -> None:
        raise SyncError("async failure")

    def die(self) -> None:
        os._exit(1)

    def make_tensors(self) -> dict[str, torch.Tensor]:
        return {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                "b": torch.ones(4, dtype=torch.bfloat16)}

    def total(self, named: dict[str, torch.Tensor]) -> float:
        return float(sum(t.float().sum() for t in named.values()))

    def echo(self, value: object) -> object:
        return value

    async def echo_kwargs(self, **kwargs: object) -> dict[str, object]:
        return kwargs


def broken_factory() -> Probe:
    raise ConfigError("factory failed: set model.path")


class SmallModel(torch.nn.Module):
    def __init__(self, seed: int, device: str = "cpu") -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = torch.nn.Linear(8, 4, device=device)
        self.table = torch.nn.Parameter(torch.randn(3, 5).to(device, torch.bfloat16))


class TrainerProbe(TrainerWeights):
    """A trainer's weight half over a small model with float32 and bf16 tensors."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(SmallModel(seed=1, device=device))

    async def perturb(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(1)


def rollout_probe(device: str = "cpu") -> RolloutWeights:
    return RolloutWeights(SmallModel(seed=2, device=device))
