"""Load, override, check and dump the configuration.

`load_config("run.yaml", ["rollout.n=8", "algorithm.adv_estimator=rloo"])` reads YAML, applies
dotted overrides, type-checks every value, rejects unknown keys (suggesting the closest valid
one) and checks cross-field rules, always naming the keys at fault. `dump_config` writes YAML
that `load_config` reads back to an identical object. The schema is in `config_schema.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config_schema import Config
from asyncrl.errors import ConfigError

__all__ = ["Config", "load_config", "dump_config", "config_from_dict", "config_to_dict"]

PIPELINES = ("colocated", "one_step_off", "fully_async")
BACKENDS = ("local", "ray")
ADV_ESTIMATORS = ("gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus",
                  "reinforce_plus_plus_baseline", "opo", "gpg", "remax")
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg")
POLICY_LOSSES = ("vanilla", "gspo", "cispo", "gpg")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs", "k3+", "low_var_kl+")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
TASKS = ("arithmetic", "countdown", "code", "longtail")


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read YAML (or defaults), apply `key.sub=value` overrides, and check everything."""
    raw: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        raw = yaml.safe_load(text) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
    for item in overrides:
        _apply_override(raw, item)
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    cfg = _build(Config, raw, prefix="")
    validate(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = config_to_dict(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def dump_config(cfg: Config, path: str | Path | None = None) -> str:
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return text


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its one-line docstring (the string literal under the field)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            if isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = nxt.value.value  # type: ignore[attr-defined]
    return docs


# ---- overrides -------------------------------------------------------------------------------


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, value_text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    try:
        value = yaml.safe_load(value_text) if value_text != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


# ---- typed construction ----------------------------------------------------------------------


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            raise ConfigError(_unknown_key_message(prefix + str(key), prefix, names))
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(hints[name], raw[name], prefix + name)
    return cls(**kwargs)


def _unknown_key_message(full_key: str, prefix: str, names: list[str]) -> str:
    candidates = [prefix + n for n in names]
    close = difflib.get_close_matches(full_key, candidates, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else f"; valid keys: {', '.join(candidates)}"
    return f"unknown config key {full_key}{hint}"


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(typing.get_args(tp), value, key)
    if origin is tuple:
        return _coerce_tuple(typing.get_args(tp), value, key)
    return _coerce_scalar(tp, value, key)


def _coerce_union(args: tuple[Any, ...], value: Any, key: str) -> Any:
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(arg, value, key)
        except ConfigError:
            continue
    raise ConfigError(f"{key}: {value!r} does not match any of {args}")


def _coerce_tuple(args: tuple[Any, ...], value: Any, key: str) -> tuple[Any, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{key} must have {len(args)} items, got {value!r}")
    return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key} must be {tp.__name__}, got {value!r} ({type(value).__name__})")


# ---- cross-field rules -----------------------------------------------------------------------


def _choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}{hint}")


def _positive(cfg: Config) -> None:
    for key in ("data.train_batch_size", "data.max_response_length", "rollout.n",
                "actor.ppo_mini_batch_size", "actor.ppo_epochs", "trainer.total_training_steps",
                "async_training.require_batches", "async_training.trigger_parameter_sync_step",
                "rollout.kv_budget_tokens", "rollout.max_num_seqs", "rollout.num_engines",
                "actor.ppo_micro_batch_tokens"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) <= 0:
            raise ConfigError(f"{key} must be positive")


def validate(cfg: Config) -> None:
    """Cross-field rules; each message names the keys that fix it."""
    _choice(cfg.pipeline, PIPELINES, "pipeline")
    _choice(cfg.backend, BACKENDS, "backend")
    _choice(cfg.algorithm.adv_estimator, ADV_ESTIMATORS, "algorithm.adv_estimator")
    _choice(cfg.actor.policy_loss, POLICY_LOSSES, "actor.policy_loss")
    _choice(cfg.actor.loss_agg_mode, LOSS_AGG_MODES, "actor.loss_agg_mode")
    _choice(cfg.actor.kl_loss_type, KL_KINDS, "actor.kl_loss_type")
    _choice(cfg.algorithm.kl_penalty, KL_KINDS, "algorithm.kl_penalty")
    _choice(cfg.algorithm.kl_ctrl.type, ("fixed", "adaptive"), "algorithm.kl_ctrl.type")
    _choice(cfg.actor.off_policy_correction, ("none", "token", "sequence"), "actor.off_policy_correction")
    _choice(cfg.model.dtype, ("float32", "bfloat16"), "model.dtype")
    _choice(cfg.trainer.device, ("cpu", "cuda"), "trainer.device")
    if not cfg.data.train_files:
        _choice(cfg.data.task, TASKS, "data.task")
    for name in cfg.trainer.logger:
        _choice(name, LOGGERS, "trainer.logger")
    _positive(cfg)
    _batch_rules(cfg)
    _async_rules(cfg)


def _batch_rules(cfg: Config) -> None:
    mini, batch = cfg.actor.ppo_mini_batch_size, cfg.data.train_batch_size
    if cfg.pipeline != "fully_async" and (mini > batch or batch % mini):
        raise ConfigError(
            f"data.train_batch_size={batch} must be a multiple of actor.ppo_mini_batch_size={mini}")
    grouped = cfg.algorithm.adv_estimator in GROUP_ESTIMATORS
    if grouped and cfg.rollout.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares responses within a "
            f"group: set rollout.n >= 2 (got {cfg.rollout.n})")
    if cfg.algorithm.filter_groups.enable and cfg.rollout.n < 2:
        raise ConfigError("algorithm.filter_groups.enable needs rollout.n >= 2")
    if not 0 <= cfg.rollout.temperature <= 10:
        raise ConfigError("rollout.temperature must be in [0, 10]")
    if cfg.data.max_prompt_length + cfg.data.max_response_length > cfg.rollout.kv_budget_tokens:
        raise ConfigError("rollout.kv_budget_tokens must hold one full sequence: at least "
                          "data.max_prompt_length + data.max_response_length")


def _async_rules(cfg: Config) -> None:
    a = cfg.async_training
    if a.staleness_threshold < 0:
        raise ConfigError("async_training.staleness_threshold must be >= 0")
    if a.partial_rollout and a.staleness_threshold <= 0:
        raise ConfigError("async_training.partial_rollout needs async_training.staleness_threshold "
                          "> 0 (with 0 no generation is ever in flight at a sync)")
    if cfg.pipeline != "colocated" and cfg.algorithm.adv_estimator == "gae":
        raise ConfigError(f"pipeline={cfg.pipeline} does not train a critic yet: use "
                          "algorithm.adv_estimator=grpo (or another critic-free estimator)")
