"""Rollout engines: `TorchEngine` (continuous batching in plain torch, CPU or one GPU)."""

from asyncrl.rollout.engine import TorchEngine, run_sync
from asyncrl.rollout.settings import EngineSettings

__all__ = ["EngineSettings", "TorchEngine", "run_sync"]
