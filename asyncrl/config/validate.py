"""Check a built configuration: every field against what its schema declaration says (choices,
range, finiteness), then the rules that span several keys. Each message is one line that names
the key at fault and the fix.

`check_fields` is generic: it reads any frozen-dataclass section's `Literal` types and `knob`
metadata, so a key declared in the schema is checked with no edit here. What it does not do:
coerce YAML values into types (`load.py`) or resolve derived numbers (the run plan).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from pathlib import Path
from typing import Any, Literal

from asyncrl.config.fields import RULES, hint_of, read_by, rule_of
from asyncrl.config.keys import value_at
from asyncrl.config.names import GROUP_ESTIMATORS, SYNC_ONLY_ESTIMATORS
from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError


def validate(cfg: Config) -> None:
    """Fields, then the cross-field rules; each message names the keys that fix it."""
    check_fields(cfg)
    _resume_mode(cfg.trainer.resume_mode)
    _batch_rules(cfg)
    _async_rules(cfg)
    _restart_rules(cfg)
    _long_tail_rules(cfg)
    _multi_turn_rules(cfg)
    _task_rules(cfg)


# ---- one field at a time, from the schema's declaration ------------------------------------------


def check_fields(node: Any, prefix: str = "") -> None:
    """Every field of the dataclass `node` (and of its sections) within its choices and range."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
            continue
        _check_choice(hints[f.name], value, key)
        _check_range(f, value, key)


def _check_choice(tp: Any, value: Any, key: str) -> None:
    """A `Literal` field holds one of its values; a `tuple[Literal[...], ...]` only such items."""
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            for item in value:
                _check_choice(args[0], item, key)
        return
    if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
        allowed = [str(a) for a in typing.get_args(tp)]
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}{hint}")


def _check_range(f: dataclasses.Field[Any], value: Any, key: str) -> None:
    items = value if isinstance(value, tuple) else (value,)
    numbers = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return
    rule = rule_of(f)
    finite = all(math.isfinite(v) for v in numbers)
    if finite and (not rule or all(RULES[rule](v) for v in numbers)):
        return
    fix = f"set {key} {rule}" if rule else f"set {key} to a finite number"
    hint = f" ({hint_of(f)})" if hint_of(f) else ""
    shown = list(value) if isinstance(value, tuple) else value
    problem = "is out of range" if finite else "is not a finite number"
    raise ConfigError(f"{key}={shown!r} {problem}: {fix}{hint}")


def pipeline_keys(node: Any, prefix: str = "") -> typing.Iterator[tuple[str, tuple[str, ...]]]:
    """(dotted key, the pipelines that read it) of every key only some pipelines read."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from pipeline_keys(value, f"{prefix}{f.name}.")
        elif read_by(f):
            yield prefix + f.name, read_by(f)


def check_pipeline_keys(cfg: Config) -> None:
    """A key the chosen pipeline ignores, set to other than its default, is an error naming the
    key and the pipelines that read it. Real runs check this; `asyncrl sim` treats a config as a
    template for several pipelines (`--compare`) and does not."""
    default = Config()
    for key, readers in pipeline_keys(cfg):
        value, unset = value_at(cfg, key), value_at(default, key)
        if cfg.pipeline not in readers and value != unset:
            raise ConfigError(f"{key}={value!r} has no effect with pipeline={cfg.pipeline} (it is read by "
                              f"pipeline={' / '.join(readers)}): remove it or set pipeline={readers[-1]}")


# ---- rules across keys ---------------------------------------------------------------------------


def _resume_mode(mode: str) -> None:
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        raise ConfigError(f"trainer.resume_mode={mode!r} is not auto, disable or an existing directory: set "
                          "trainer.resume_mode to auto, disable, or a run or checkpoint directory")


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
    if s.enable and cfg.algorithm.adv_estimator in SYNC_ONLY_ESTIMATORS:
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
    r = cfg.reward
    if r.overlong_buffer > (r.overlong_max_len or cfg.data.max_response_length):
        raise ConfigError(f"reward.overlong_buffer={r.overlong_buffer} is longer than the responses it punishes "
                          f"(reward.overlong_max_len, else data.max_response_length="
                          f"{r.overlong_max_len or cfg.data.max_response_length}): lower it")


def _restart_rules(cfg: Config) -> None:
    r = cfg.rollout
    if cfg.trainer.ranks > 1 and cfg.backend != "processes":
        raise ConfigError(f"trainer.ranks={cfg.trainer.ranks} needs backend=processes (each rank its own process); "
                          "set backend=processes or trainer.ranks=1")
    if r.max_restarts and (cfg.backend != "ray" or r.num_engines < 2 or cfg.trainer.device != "cpu"):
        raise ConfigError(f"rollout.max_restarts={r.max_restarts} needs backend=ray, rollout.num_engines >= 2 (the "
                          "others carry the work while a restarted worker waits for the next weight sync) and "
                          "trainer.device=cpu (weights through the object store); set rollout.max_restarts=0")


def _multi_turn_rules(cfg: Config) -> None:
    m, r = cfg.rollout.multi_turn, cfg.rollout
    if r.agent.entrypoint and m.episode:
        raise ConfigError(f"rollout.agent.entrypoint={r.agent.entrypoint!r} and rollout.multi_turn.episode="
                          f"{m.episode!r} both name the episode: keep one of them")
    named = [f"rollout.multi_turn.{k}={v!r}" for k, v in (("tool_config_path", m.tool_config_path),
                                                           ("episode", m.episode)) if v]
    if named and not m.enable:
        raise ConfigError(f"{' and '.join(named)} without rollout.multi_turn.enable=true would train single-turn "
                          f"and never use it: set rollout.multi_turn.enable=true, or drop the key")
    if m.enable and r.ignore_eos:
        raise ConfigError("rollout.multi_turn.enable ends each model turn at its end-of-turn token: set "
                          "rollout.ignore_eos=false")
    if m.enable and m.max_episode_tokens and m.max_episode_tokens <= cfg.data.max_prompt_length:
        raise ConfigError(f"rollout.multi_turn.max_episode_tokens={m.max_episode_tokens} leaves no room to answer a "
                          f"prompt of data.max_prompt_length={cfg.data.max_prompt_length}: raise it, or set 0 "
                          "(prompt + response lengths)")


def _task_rules(cfg: Config) -> None:
    """Options set for a task that is not used would do nothing (their names and values are checked
    where the prompts are made: `asyncrl.data.tasks.task_rows`)."""
    if cfg.data.task_options and cfg.data.train_files:
        raise ConfigError("data.task_options shape the built-in data.task, which data.train_files replace: "
                          "remove data.task_options")


def _async_rules(cfg: Config) -> None:
    if cfg.pipeline != "colocated" and cfg.algorithm.adv_estimator in SYNC_ONLY_ESTIMATORS:
        raise ConfigError(f"pipeline={cfg.pipeline} supports critic-free estimators without "
                          "extra generation: use algorithm.adv_estimator=grpo, rloo, opo, ...")
