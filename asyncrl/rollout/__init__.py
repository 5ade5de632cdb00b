"""Rollout engines: `TorchEngine` (continuous batching in plain torch, CPU or one GPU)."""

from asyncrl.rollout.engine import TorchEngine, run_sync

__all__ = ["TorchEngine", "run_sync"]
