"""Rollout engines: `TorchEngine` (continuous batching in plain torch, CPU or one GPU)."""

from asyncrl.rollout.engine import TorchEngine, run_sync
from asyncrl.rollout.settings import EngineSettings, engine_settings

__all__ = ["EngineSettings", "TorchEngine", "engine_settings", "run_sync"]
