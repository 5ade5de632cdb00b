"""Rollout engines by name (`rollout.engine`): each entry builds one `asyncrl.roles.Engine` over
a rollout host's own copy of the policy.

To add an engine: one module implementing `Engine`, one entry here, its name in
`asyncrl.config.names.ENGINES`; `mypy` reports any protocol method the new class lacks or mistypes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from torch import nn

from asyncrl.config import names
from asyncrl.config.schema import RolloutConfig
from asyncrl.roles import Engine
from asyncrl.rollout.settings import EngineSettings, engine_settings

EngineBuilder = Callable[[nn.Module, Sequence[int], EngineSettings, Executor | None], Engine]
"""(model, eos token ids, settings, compute thread or None) -> engine. An engine that runs torch
in this process runs it on the compute thread when one is given (`asyncrl.compute`)."""


def _torch(model: nn.Module, eos_ids: Sequence[int], settings: EngineSettings, compute: Executor | None) -> Engine:
    from asyncrl.rollout.engine import TorchEngine

    return TorchEngine(model, list(eos_ids), settings, executor=compute)


ENGINES: dict[str, EngineBuilder] = {"torch": _torch}
assert tuple(ENGINES) == names.ENGINES, "register the engine's name in asyncrl.config.names.ENGINES"


def build_engine(cfg: RolloutConfig, model: nn.Module, eos_ids: Sequence[int], *, device: str,
                 seed: int, compute: Executor | None = None, max_model_len: int | None = None) -> Engine:
    """The engine `rollout.engine` names (the config has already checked the name), with the
    settings `engine_settings` resolves from `cfg` on `device`."""
    settings = engine_settings(cfg, device=device, seed=seed, max_model_len=max_model_len)
    return ENGINES[cfg.engine](model, eos_ids, settings, compute)
