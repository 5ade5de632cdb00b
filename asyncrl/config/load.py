"""Load, override, type and dump the configuration.

`load_config("run.yaml", ["rollout.n=8", "algorithm.adv_estimator=rloo"])` reads YAML, applies
dotted overrides, builds the typed sections (rejecting unknown keys, suggesting only existing
keys close in name and meaning) and validates the result (`validate.py`), always naming the keys
at fault. verl's key names are read too, through the one table of `verl.py`. `dump_config`
writes YAML that `load_config` reads back to an identical object. The schema is `schema.py`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from asyncrl.config.hydra import DELETE, apply_hydra
from asyncrl.config.keys import leaf_keys, section_keys, unknown_key_message
from asyncrl.config.schema import Config
from asyncrl.config.validate import validate
from asyncrl.config.verl import Translation, is_verl_key, renamed_keys, translate, warn_not_modelled
from asyncrl.errors import ConfigError, ConfigErrors


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
                entry: str | None = None) -> Config:
    """Read YAML (or defaults), apply `key.sub=value` overrides, and check everything. Keys may
    be ours or verl's (`asyncrl.config.verl`; `entry` is verl's `python -m` module, if known);
    verl keys we do not model are named in one warning."""
    return _checked(resolve(path, overrides, entry))


def load_train_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """`load_config` for what trains (`asyncrl train`, the Python API): a command line in verl's
    names must name its model, as verl requires, rather than train the built-in toy on its data."""
    translation = resolve(path, overrides, warn=False)
    if translation.changes_training:  # all of them at once: a recipe is fixed in one go
        raise ConfigErrors(list(translation.changes_training.values()))
    if translation.uses_verl_names and "model.path" not in translation.values:
        raise ConfigError("a verl command line without actor_rollout_ref.model.path would train asyncrl's "
                          "built-in toy model: set the model's path (model.path=tiny means the toy)")
    if "data.train_files" in translation.values and "model.path" not in translation.values:
        raise ConfigError("data.train_files without model.path would train asyncrl's built-in toy model (0.8M "
                          "parameters) on your data: set model.path (model.path=tiny means the toy)")
    warn_not_modelled(translation)
    return _checked(translation)


def _checked(translation: Translation) -> Config:
    cfg = config_from_dict(_nest(translation.values))
    check_step_counts(cfg, set(translation.values))
    return cfg


def check_step_counts(cfg: Config, given: set[str]) -> None:
    """Fully async reads its length from rollout.total_rollout_steps; a total_training_steps also
    given must agree with it, or one of them would be silently ignored."""
    if cfg.pipeline != "fully_async" or not {"rollout.total_rollout_steps", "trainer.total_training_steps"} <= given:
        return
    per_update = cfg.actor.ppo_mini_batch_size * cfg.async_training.require_batches
    updates = -(-cfg.rollout.total_rollout_steps // per_update)
    if updates != cfg.trainer.total_training_steps:
        raise ConfigError(f"rollout.total_rollout_steps={cfg.rollout.total_rollout_steps} ({updates} updates of "
                          f"{per_update} prompts) and trainer.total_training_steps={cfg.trainer.total_training_steps} "
                          f"disagree; set only one of them")


def resolve(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
            entry: str | None = None, warn: bool = True) -> Translation:
    """The YAML's and the overrides' keys in ours, warning once about verl keys not modelled
    (`warn`; `load_train_config` warns only once it has refused none)."""
    raw: dict[str, Any] = {} if path is None else _read_yaml(Path(path))
    pairs = apply_hydra([*_flatten(raw), *(_parse_override(item) for item in overrides)], known_key)
    translation = translate(pairs, entry)
    if warn:
        warn_not_modelled(translation)
    return translation


def known_key(key: str) -> bool:
    """A key ours or verl's (what Hydra's `~key` may delete)."""
    return key in leaf_keys() or key in section_keys() or is_verl_key(key)


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
    cfg = build(Config, raw, prefix="")
    if cfg.rollout.agent.entrypoint and not cfg.rollout.multi_turn.enable:  # an agent's episodes are multi-turn
        mt = dataclasses.replace(cfg.rollout.multi_turn, enable=True)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, multi_turn=mt))
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
    """`section.key=value` (or hydra's `+key=value`, `++key=value`, `~key`, `~key=value`) -> (key, YAML value)."""
    key, sep, value_text = item.partition("=")
    if item.startswith("~") and not sep and len(item) > 1:
        return item, DELETE
    if not sep or not key.lstrip("+~"):
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


def build(cls: type, raw: Any, prefix: str) -> Any:
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
        return build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(typing.get_args(tp), value, key)
    if origin is tuple:
        return _coerce_tuple(typing.get_args(tp), value, key)
    if origin is Literal:  # a string choice: typed here, its value checked by `validate`
        word = {True: "on", False: "off"}.get(value) if isinstance(value, bool) else None
        if word in typing.get_args(tp):
            return word  # YAML 1.1 reads a bare on/off as a boolean
        return _coerce_scalar(str, value, key)
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
