"""Reward functions looked up by `data_source`, verl-style, plus user-supplied ones.

A reward function has verl's `compute_score` signature:
`fn(data_source, solution_str, ground_truth, extra_info) -> float | dict` (a dict needs a
`"score"` key; its other numeric entries become `RewardResult.details`). Built-in scorers
register themselves with `@register(...)`; `resolve_reward_fn` returns the one for a data source,
or the user's function from config `reward.custom_function` (`"pkg.module:fn"` or
`"path/to/file.py:fn"`), which then scores every data source, as in verl.

This module only finds functions. Running them safely (timeouts, errors as results) is
`runner.py`; the scorers themselves live in `math_rewards.py`, `puzzles.py`, `code_exec.py`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.errors import ConfigError
from asyncrl.user_code import import_module_or_file

RewardFn = Callable[[str, str, str, dict[str, Any]], "float | dict[str, Any]"]
RewardStatus = Literal["ok", "error", "timeout", "invalid"]

_REGISTRY: dict[str, RewardFn] = {}
_PREFIXES: dict[str, RewardFn] = {}
_BUILTIN_MODULES = ("math_rewards", "puzzles", "code_exec")


@dataclass(frozen=True)
class RewardResult:
    """The outcome of scoring one response. `error` holds the message when status != "ok"."""

    score: float
    details: dict[str, float] = field(default_factory=dict)
    status: RewardStatus = "ok"
    error: str = ""


def register(*data_sources: str, prefix: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Register a reward function for these data sources (or name prefixes, e.g. "aime")."""
    table = _PREFIXES if prefix else _REGISTRY

    def decorator(fn: RewardFn) -> RewardFn:
        for name in data_sources:
            assert name not in table or table[name] is fn, f"reward for '{name}' registered twice"
            table[name] = fn
        return fn

    return decorator


def known_data_sources() -> list[str]:
    """Every built-in data source name; prefixes are shown as `name*`."""
    _load_builtins()
    return sorted(_REGISTRY) + sorted(f"{p}*" for p in _PREFIXES)


def resolve_reward_fn(data_source: str, custom_path: str | None = None) -> RewardFn:
    """The user's function if `custom_path` is set, else the built-in one for `data_source`."""
    if custom_path:
        return load_custom_function(custom_path)
    _load_builtins()
    if data_source in _REGISTRY:
        return _REGISTRY[data_source]
    for prefix, fn in _PREFIXES.items():
        if data_source.startswith(prefix):
            return fn
    raise ConfigError(
        f"no reward function for data_source '{data_source}'. Built-in: "
        f"{', '.join(known_data_sources())}. Plug your own with "
        f"reward.custom_function='path/to/file.py:fn' (or 'package.module:fn'), where "
        f"fn(data_source, solution_str, ground_truth, extra_info) returns a float or a dict "
        f"with a 'score' key."
    )


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any]) -> float | dict[str, Any]:
    """Dispatch to the built-in scorer of `data_source` (verl's `default_compute_score`)."""
    return resolve_reward_fn(data_source)(data_source, solution_str, ground_truth, extra_info)


def load_custom_function(spec: str) -> RewardFn:
    """Import `"module:fn"` or `"path/to/file.py:fn"` (config `reward.custom_function`)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"reward.custom_function must look like 'file.py:fn' or 'module:fn', got '{spec}'")
    try:
        module = import_module_or_file(where, "asyncrl_custom_reward_")
    except Exception as exc:  # a user's module can fail to import in any way
        raise ConfigError(f"reward.custom_function: cannot import '{where}': {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"reward.custom_function: '{where}' has no function '{name}'")
    return fn


def _load_builtins() -> None:
    for name in _BUILTIN_MODULES:
        importlib.import_module(f"asyncrl.rewards.{name}")
