"""Optimizer, learning-rate schedule and RNG state shared by the actor and the critic.

The schedule is verl's (`verl.utils.torch_functional.get_{constant,cosine}_schedule_with_warmup`):
a linear warm-up from 0 over `warmup_steps` optimizer steps, then either the full rate
(constant) or a half cosine from `lr` down to `min_lr_ratio x lr` at `total_steps`. The factor
is a pure function of the step (`lr_factor`); `LambdaLR` keeps only the step count, so a
checkpoint's scheduler state plus the same config resumes the schedule exactly.

Not here: how many optimizer steps a run makes (the factory counts them from the config).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

if TYPE_CHECKING:
    from asyncrl.config.schema import ActorConfig

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    """Warm-up then constant or cosine decay, in optimizer steps."""

    warmup_steps: int = 0
    total_steps: int = 0  # all optimizer steps of the run (the cosine ends here)
    kind: str = "constant"
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        assert self.kind in SCHEDULES, f"unknown lr schedule {self.kind!r}"
        assert 0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio is a fraction of lr"
        assert self.kind == "constant" or self.total_steps > 0, "a cosine schedule needs total_steps"


def resolve_warmup(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """Warm-up steps: `warmup_steps`, or `int(warmup_ratio x total_steps)` when it is -1 (verl).

    Example: (-1, 0.1, 36) -> 3; (5, 0.1, 36) -> 5."""
    return int(warmup_ratio * total_steps) if warmup_steps < 0 else warmup_steps


def lr_factor(step: int, schedule: LRSchedule) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of `lr`.

    Example: warm-up 2, total 10, cosine, min ratio 0.1: steps 0, 1, 2 -> 0, 0.5, 1; step 6
    (half way through the decay) -> 0.55; step 10 -> 0.1."""
    warm = schedule.warmup_steps
    if step < warm:
        return step / max(1, warm)
    if schedule.kind == "constant":
        return 1.0
    progress = (step - warm) / max(1, schedule.total_steps - warm)
    low = schedule.min_lr_ratio
    return max(0.0, math.cos(math.pi * progress) * (1 - low) / 2 + (1 + low) / 2)


def actor_schedule(cfg: ActorConfig, total_steps: int) -> LRSchedule:
    """The actor's LR schedule over a run of `total_steps` optimizer steps (0: unknown, which
    only a constant schedule with warm-up in steps can do without)."""
    assert total_steps > 0 or (cfg.lr_scheduler == "constant" and cfg.warmup_steps >= 0), \
        "actor.lr_scheduler=cosine and actor.warmup_steps=-1 need the run's total optimizer steps"
    return LRSchedule(warmup_steps=resolve_warmup(cfg.warmup_steps, cfg.warmup_ratio, total_steps),
                      total_steps=total_steps, kind=cfg.lr_scheduler, min_lr_ratio=cfg.min_lr_ratio)


def make_optimizer(trainable: list[nn.Parameter], lr: float, weight_decay: float, betas: tuple[float, float],
                   schedule: LRSchedule) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `trainable` (the trainable parameters, LoRA: the adapters; or their float32
    masters, `training.precision`), with `schedule` stepped once per optimizer step."""
    opt = adamw(trainable, lr=lr, weight_decay=weight_decay, betas=betas)

    def factor(step: int) -> float:  # a plain function: LambdaLR's state_dict then omits it
        return lr_factor(step, schedule)

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def adamw(params: list[nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW's fused kernel where torch has one for the parameters' device (CPU since torch 2.4),
    else the foreach one; same math and state-dict format either way. `load_state_dict` brings
    back the saved group's flags, so an optimizer restored from an older (for-loop) checkpoint
    steps the same, only slower."""
    # AdamW checks the device only at the first step; this is the list it checks against.
    fused = all(p.device.type in _get_fused_kernels_supported_devices() and p.is_floating_point()
                for p in params)
    return torch.optim.AdamW(params, fused=fused, foreach=not fused, **kwargs)


def seed_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_seed_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
