"""Load, override, check and dump the configuration.

`load_config("run.yaml", ["rollout.n=8", "algorithm.adv_estimator=rloo"])` reads YAML, applies
dotted overrides, type-checks every value, rejects unknown keys (suggesting only existing keys
close in name and meaning) and checks cross-field rules, always naming the keys at fault. verl's
key names are read too, through the one table of `verl_keys.py`. `dump_config` writes YAML that
`load_config` reads back to an identical object. The schema is in `config_schema.py`; key
listings, docs and hints in `config_keys.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

# The names a registry answers to are defined once, by the registry (or asyncrl.names).
from asyncrl.algorithms.advantages import ADV_ESTIMATOR_NAMES as ADV_ESTIMATORS
from asyncrl.algorithms.agg import LOSS_AGG_MODES
from asyncrl.algorithms.kl import KL_PENALTY_KINDS as KL_KINDS
from asyncrl.algorithms.policy_loss import POLICY_LOSS_NAMES as POLICY_LOSSES
from asyncrl.config_keys import documented_yaml, field_docs, leaf_keys, reference_markdown, unknown_key_message
from asyncrl.config_schema import Config
from asyncrl.errors import ConfigError
from asyncrl.names import BACKENDS, ENGINES, PIPELINES
from asyncrl.verl_keys import Translation, renamed_keys, translate, warn_not_modelled

__all__ = ["Config", "load_config", "dump_config", "config_from_dict", "config_to_dict", "documented_yaml",
           "field_docs", "reference_markdown"]

GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg")
"""Estimators that compare responses within a group (they need rollout.n >= 2)."""
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
TASKS = ("arithmetic", "countdown", "code", "longtail")


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
                entry: str | None = None) -> Config:
    """Read YAML (or defaults), apply `key.sub=value` overrides, and check everything. Keys may
    be ours or verl's (`asyncrl.verl_keys`; `entry` is verl's `python -m` module, if known);
    verl keys we do not model are named in one warning."""
    return config_from_dict(_nest(resolve(path, overrides, entry).values))


def resolve(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
            entry: str | None = None) -> Translation:
    """The YAML's and the overrides' keys in ours, warning once about verl keys not modelled."""
    raw: dict[str, Any] = {} if path is None else _read_yaml(Path(path))
    pairs = [*_flatten(raw), *(_parse_override(item) for item in overrides)]
    translation = translate(pairs, entry)
    warn_not_modelled(translation.not_modelled)
    return translation


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        problem = "is a directory" if path.exists() else "not found"
        raise ConfigError(f"config file {path} {problem}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of config sections")
    return raw


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


# ---- overrides -------------------------------------------------------------------------------


def _parse_override(item: str) -> tuple[str, Any]:
    """`section.key=value` (or hydra's `+key=value`, `++key=value`) -> (key, YAML value)."""
    key, sep, value_text = item.partition("=")
    if not sep or not key.lstrip("+"):
        raise ConfigError(f"override {item!r} must look like section.key=value")
    try:
        value = yaml.safe_load(value_text) if value_text != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
    return key, value


def _flatten(raw: dict[str, Any], prefix: str = "") -> typing.Iterator[tuple[str, Any]]:
    """A YAML tree's (dotted key, value) leaves; a mapping under one of our keys is its value."""
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in leaf_keys():
            yield from _flatten(value, key + ".")
        else:
            yield key, value


def _nest(values: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for key, value in values.items():
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


# ---- typed construction ----------------------------------------------------------------------


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            raise ConfigError(unknown_key_message(prefix + str(key), renamed_keys()))
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(hints[name], raw[name], prefix + name)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
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
    if tp is float and isinstance(value, str):
        value = _yaml11_float(value)  # YAML 1.1 reads "3e-5" (no dot) as a string
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key} must be {tp.__name__}, got {value!r} ({type(value).__name__})")


def _yaml11_float(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


# ---- cross-field rules -----------------------------------------------------------------------


def _choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}{hint}")


_RULES: dict[str, Callable[[float], bool]] = {
    ">= 1": lambda v: v >= 1,
    ">= 0": lambda v: v >= 0,
    "> 0": lambda v: v > 0,
    "> 1": lambda v: v > 1,
    "to -1 (off) or > 0": lambda v: v == -1 or v > 0,
    "to -1 (off) or >= 0": lambda v: v == -1 or v >= 0,
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 10]": lambda v: 0 < v <= 10,
    "in [0, 10]": lambda v: 0 <= v <= 10,
}
"""Value rules by the words the error message uses for them."""

VALUE_RULES: dict[str, tuple[str, ...]] = {
    ">= 1": ("data.task_size", "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
             "rollout.n", "rollout.val_n", "rollout.kv_budget_tokens", "rollout.max_num_seqs",
             "rollout.num_engines", "rollout.tensor_model_parallel_size", "rollout.nnodes", "rollout.num_cpus",
             "actor.ppo_epochs", "actor.ppo_mini_batch_size", "actor.ppo_micro_batch_tokens", "critic.ppo_epochs",
             "algorithm.kl_ctrl.horizon", "reward.num_workers", "trainer.total_training_steps", "trainer.nnodes",
             "trainer.num_cpus", "trainer.ranks", "async_training.require_batches",
             "async_training.trigger_parameter_sync_step",
             "sim.prompt_length", "sandbox.memory_mb", "sandbox.tmp_mb", "sandbox.max_output_kb",
             "sandbox.max_processes", "tp_planner.calm_steps", "tp_planner.max_tp",
             "tail_batching.prompt_speculation", "tail_batching.response_speculation"),
    ">= 0": ("num_threads", "data.val_size", "rollout.n_gpus_per_node", "rollout.total_rollout_steps",
             "rollout.test_freq", "rollout.max_restarts",
             "actor.weight_decay", "actor.clip_ratio_low", "model.lora_rank",
             "actor.clip_ratio_high", "actor.kl_loss_coef", "critic.warmup_steps", "algorithm.kl_ctrl.kl_coef",
             "algorithm.filter_groups.max_num_gen_batches", "trainer.test_freq", "trainer.save_freq",
             "trainer.max_ckpt_to_keep", "trainer.n_gpus_per_node", "async_training.staleness_threshold",
             "async_training.max_concurrent_samples_per_server",
             "sim.length_sigma", "sim.trace_max_events"),
    "> 0": ("model.lora_alpha", "actor.lr",
            "actor.grad_clip", "actor.is_cap", "critic.lr", "critic.grad_clip", "critic.cliprange_value",
            "algorithm.kl_ctrl.target_kl", "reward.timeout_s", "trainer.stop_timeout_s", "sim.length_median",
            "reward_scheduler.timeout_lambda", "reward_scheduler.min_timeout_s", "reward_scheduler.max_timeout_s"),
    "> 1": ("actor.clip_ratio_c", "tp_planner.growth"),
    "to -1 (off) or > 0": ("rollout.top_k",),
    "to -1 (off) or >= 0": ("async_training.max_version_lag", "actor.warmup_steps"),
    "in (0, 1]": ("rollout.top_p", "rollout.gpu_memory_utilization", "reward.max_failure_ratio",
                  "stream_trainer.min_done", "stream_trainer.max_done", "stream_trainer.check_every"),
    "in [0, 1]": ("algorithm.gamma", "algorithm.lam", "sim.accuracy", "sim.length_prompt_share",
                  "actor.warmup_ratio", "actor.min_lr_ratio"),
    "in [0, 1)": ("actor.betas",),
    "in (0, 10]": ("rollout.temperature",),
    "in [0, 10]": ("rollout.val_temperature",),
}
"""Rule -> the keys it holds for; every float is also checked to be finite (no nan, no inf)."""

_HINTS = {
    "rollout.temperature": "at 0 the training log-probs are meaningless; for greedy validation set "
                           "rollout.val_temperature=0",
    "actor.clip_ratio_c": "it is the dual-clip bound of negative advantages",
}


def _get(cfg: Any, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)


def _check_values(cfg: Config) -> None:
    """Every key of VALUE_RULES within its range and every float finite; the message names the key,
    the value and the fix."""
    ruled = {key: rule for rule, keys in VALUE_RULES.items() for key in keys}
    for key, value in _numbers(cfg, ""):
        items = value if isinstance(value, tuple) else (value,)
        finite = all(math.isfinite(v) for v in items)
        rule = ruled.get(key)
        if finite and (rule is None or all(_RULES[rule](v) for v in items)):
            continue
        fix = f"set {key} {rule}" if rule else f"set {key} to a finite number"
        hint = f" ({_HINTS[key]})" if key in _HINTS else ""
        shown = list(value) if isinstance(value, tuple) else value
        problem = "is out of range" if finite else "is not a finite number"
        raise ConfigError(f"{key}={shown!r} {problem}: {fix}{hint}")


def _numbers(node: Any, prefix: str) -> typing.Iterator[tuple[str, Any]]:
    """(dotted key, value) of every int, float or tuple-of-floats field, depth first."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numbers(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield prefix + f.name, value
        elif isinstance(value, tuple) and value and all(isinstance(v, (int, float)) for v in value):
            yield prefix + f.name, value


def _resume_mode(mode: str) -> None:
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        raise ConfigError(f"trainer.resume_mode={mode!r} is not auto, disable or an existing directory: set "
                          "trainer.resume_mode to auto, disable, or a run or checkpoint directory")


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
    _choice(cfg.actor.old_log_probs, OLD_LOG_PROBS, "actor.old_log_probs")
    _choice(cfg.actor.off_policy_correction, ("none", "token", "sequence"), "actor.off_policy_correction")
    _choice(cfg.rollout.engine, ENGINES, "rollout.engine")
    _choice(cfg.model.dtype, ("float32", "bfloat16"), "model.dtype")
    _choice(cfg.trainer.device, ("cpu", "cuda"), "trainer.device")
    _choice(cfg.actor.lr_scheduler, ("constant", "cosine"), "actor.lr_scheduler")
    _choice(cfg.sandbox.backend, ("auto", "bwrap", "rlimit", "http"), "sandbox.backend")
    if not cfg.data.train_files:
        _choice(cfg.data.task, TASKS, "data.task")
    for name in cfg.trainer.logger:
        _choice(name, LOGGERS, "trainer.logger")
    _check_values(cfg)
    _resume_mode(cfg.trainer.resume_mode)
    _batch_rules(cfg)
    _async_rules(cfg)
    _restart_rules(cfg)
    _long_tail_rules(cfg)


def _long_tail_rules(cfg: Config) -> None:
    """The long-tail remedies are for synchronous, on-policy training (SPEC §4)."""
    if cfg.tail_batching.enable and cfg.pipeline not in ("colocated", "one_step_off"):
        raise ConfigError(f"tail_batching.enable runs with pipeline=colocated or one_step_off, not {cfg.pipeline}; "
                          "set tail_batching.enable=false")
    if cfg.tail_batching.enable and cfg.algorithm.filter_groups.enable:
        raise ConfigError("tail_batching.enable and algorithm.filter_groups.enable both choose which groups a step "
                          "trains: set one of them to false")
    s = cfg.stream_trainer
    if s.enable and cfg.pipeline != "colocated":
        raise ConfigError(f"stream_trainer.enable runs with pipeline=colocated, not {cfg.pipeline}; "
                          "set stream_trainer.enable=false")
    if s.enable and cfg.algorithm.filter_groups.enable:
        raise ConfigError("stream_trainer.enable trains groups before the batch is chosen, which "
                          "algorithm.filter_groups.enable (dynamic sampling) does afterwards: set one of them to false")
    a = cfg.actor
    if s.enable and (a.ppo_epochs != 1 or a.ppo_mini_batch_size != cfg.data.train_batch_size):
        raise ConfigError("stream_trainer.enable makes one optimizer step per batch: set actor.ppo_epochs=1 and "
                          f"actor.ppo_mini_batch_size=data.train_batch_size={cfg.data.train_batch_size}")
    if s.enable and cfg.algorithm.adv_estimator in ("gae", "remax"):
        raise ConfigError(f"stream_trainer.enable trains each group as it finishes, which "
                          f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} cannot (it needs a critic pass or "
                          "an extra generation): use grpo, rloo, opo, ...")
    if s.enable and not s.min_done <= s.max_done:
        raise ConfigError(f"stream_trainer.min_done={s.min_done:g} must be <= stream_trainer.max_done={s.max_done:g}")
    r = cfg.reward_scheduler
    if r.min_timeout_s > r.max_timeout_s:
        raise ConfigError(f"reward_scheduler.min_timeout_s={r.min_timeout_s:g} must be <= "
                          f"reward_scheduler.max_timeout_s={r.max_timeout_s:g}")
    if cfg.sandbox.backend == "http" and not cfg.sandbox.url:
        raise ConfigError("sandbox.backend=http needs sandbox.url (SandboxFusion's run_code endpoint)")


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
    if cfg.data.max_prompt_length + cfg.data.max_response_length > cfg.rollout.kv_budget_tokens:
        raise ConfigError("rollout.kv_budget_tokens must hold one full sequence: at least "
                          "data.max_prompt_length + data.max_response_length")


def _restart_rules(cfg: Config) -> None:
    r = cfg.rollout
    if cfg.trainer.ranks > 1 and cfg.backend != "processes":
        raise ConfigError(f"trainer.ranks={cfg.trainer.ranks} needs backend=processes (each rank its own process); "
                          "set backend=processes or trainer.ranks=1")
    if r.max_restarts and (cfg.backend != "ray" or r.num_engines < 2 or cfg.trainer.device != "cpu"):
        raise ConfigError(f"rollout.max_restarts={r.max_restarts} needs backend=ray, rollout.num_engines >= 2 (the "
                          "others carry the work while a restarted worker waits for the next weight sync) and "
                          "trainer.device=cpu (weights through the object store); set rollout.max_restarts=0")


def _async_rules(cfg: Config) -> None:
    if cfg.pipeline != "colocated" and cfg.algorithm.filter_groups.enable:
        raise ConfigError("algorithm.filter_groups (DAPO dynamic sampling) runs with pipeline=colocated "
                          "only; set pipeline=colocated or algorithm.filter_groups.enable=false")
    if cfg.pipeline != "colocated" and cfg.algorithm.adv_estimator in ("gae", "remax"):
        raise ConfigError(f"pipeline={cfg.pipeline} supports critic-free estimators without "
                          "extra generation: use algorithm.adv_estimator=grpo, rloo, opo, ...")


READ_BY: dict[str, tuple[str, ...]] = {
    "async_training.require_batches": ("fully_async",),
    "async_training.trigger_parameter_sync_step": ("fully_async",),
    "async_training.staleness_threshold": ("fully_async",),
    "async_training.partial_rollout": ("fully_async",),
    "async_training.max_version_lag": ("fully_async",),
    "async_training.max_concurrent_samples_per_server": ("fully_async",),
    "async_training.use_rollout_log_probs": ("one_step_off", "fully_async"),
    "actor.old_log_probs": ("colocated",),
    "rollout.total_rollout_steps": ("fully_async",),
    "rollout.test_freq": ("fully_async",),
}
"""Keys only some pipelines read: set on another pipeline they would silently do nothing."""


def check_pipeline_keys(cfg: Config) -> None:
    """A key the chosen pipeline ignores, set to other than its default, is an error naming the
    key and the pipelines that read it. Real runs check this; `asyncrl sim` treats a config as a
    template for several pipelines (`--compare`) and does not."""
    default = Config()
    for key, readers in READ_BY.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if cfg.pipeline not in readers and value != getattr(getattr(default, section), name):
            raise ConfigError(f"{key}={value!r} has no effect with pipeline={cfg.pipeline} (it is read by "
                              f"pipeline={' / '.join(readers)}): remove it or set pipeline={readers[-1]}")


OLD_LOG_PROBS = ("auto", "recompute", "rollout")
PASS_SOURCES = ("recompute", "proximal")
"""The old-log-prob sources that cost a forward pass before the update."""


def old_log_prob_source(cfg: Config, exact_rollout: bool) -> str:
    """Where PPO's old log-probs come from: recompute | rollout | proximal | update.

    Colocated (on-policy) follows `actor.old_log_probs`; its `auto` takes, without a pass of its
    own: "update" (the update's own forward, detached: exact) when each batch is one optimizer
    step and no KL-in-reward needs them first; else "rollout" when `exact_rollout` (the engine
    computes log-probs as the trainer does, e.g. float32 on CPU: they differ by float rounding);
    else "recompute". Decoupled: the engine's behaviour log-probs by default
    (`async_training.use_rollout_log_probs`), else a recomputed proximal policy, with truncated
    importance weights when `actor.off_policy_correction` is set (decoupled PPO)."""
    if cfg.pipeline == "colocated":
        if cfg.actor.old_log_probs != "auto":
            return cfg.actor.old_log_probs
        one_step = cfg.actor.ppo_epochs == 1 and cfg.actor.ppo_mini_batch_size >= cfg.data.train_batch_size
        if one_step and not cfg.algorithm.use_kl_in_reward:
            return "update"
        return "rollout" if exact_rollout else "recompute"
    if cfg.async_training.use_rollout_log_probs:
        return "rollout"
    return "recompute" if cfg.actor.off_policy_correction == "none" else "proximal"
