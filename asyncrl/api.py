"""The Python API, for TRL users: TRL's `GRPOTrainer` and `GRPOConfig`, and `Trainer` with keywords.

    from asyncrl import GRPOConfig, GRPOTrainer                   # was: from trl import ...

    def accuracy(prompts, completions, answer, **kwargs):         # TRL's reward signature
        return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    args = GRPOConfig(output_dir="runs/grpo", learning_rate=1e-6, per_device_train_batch_size=16,
                      num_generations=8, max_completion_length=256, report_to="none")
    GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=accuracy, args=args,
                train_dataset=dataset).train()

What it takes, and what it does with it:
- `GRPOConfig`'s fields (`asyncrl.config.trl_map`: each given field is mapped with TRL's semantics,
  kept as bookkeeping, or refused in a line saying why; `trl_fields` classifies all of TRL's), as
  `args=` or as keyword arguments of `Trainer(...)`, and `config`, a mapping of asyncrl's dotted keys
  (or verl's) that wins over them; all become the overrides of `asyncrl train`, validated the same way;
- `train_dataset` / `eval_dataset`: a `datasets.Dataset` or a list of dicts with a `prompt` column,
  a string (TRL's standard format: raw text, no chat template) or a list of messages (its
  conversational format: the chat template). The other columns reach the reward functions as
  keyword arguments (and `extra_info`). Rows are written once to a JSONL file named by their
  content under the asyncrl cache (`$ASYNCRL_CACHE/datasets`), so a rerun resumes with the same
  config;
- `reward_funcs`: TRL-signature functions (`asyncrl.rewards.batch_functions`; they get TRL's keyword
  arguments: prompts, completions, completion_ids, trainer_state and the columns), 'module:fn'
  names, or a model directory or hub id (a string without ':'): the learned reward model
  (`reward.model_path`); `reward_weights` their weights. A function importable by name is named so
  and runs where the other reward work runs, the reward worker's process pool; any other callable
  (a lambda, a closure, one defined in a notebook or a script's `__main__`) runs in a thread pool of
  this process, on every backend (a reward worker in another process calls it here,
  `asyncrl.rewards.driver_calls`).

It runs `asyncrl train`'s own path (preflight, then the pipeline); nothing here is a second loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.config.load import load_train_config
from asyncrl.config.schema import Config
from asyncrl.config.trl_map import GRPOConfig, grpo_settings, step_count, world_size
from asyncrl.errors import ConfigError, DataError
from asyncrl.models.cache import cache_dir
from asyncrl.rewards.batch_functions import register_callable, serve_from_driver

FILE_KEYS = {"train_dataset": "data.train_files", "eval_dataset": "data.val_files"}
RewardFunc = Callable[..., Sequence[float | None]] | str


class Trainer:
    """One run from Python: the config is resolved (and checked) when built, trained by `train()`."""

    def __init__(self, model: str = "tiny", reward_funcs: RewardFunc | Sequence[RewardFunc] = (),
                 train_dataset: Any = None, eval_dataset: Any = None, *, args: GRPOConfig | None = None,
                 reward_weights: Sequence[float] | None = None, config: Mapping[str, Any] | None = None,
                 **trl_args: Any) -> None:
        given = {**(args.given if args is not None else {}), **trl_args}
        if reward_weights is not None:
            given["reward_weights"] = list(reward_weights)
        trl, self.notes = grpo_settings(given, world_size())
        funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
        settings: dict[str, Any] = {"model.path": model, **trl, **reward_settings(funcs, trl.pop(
            "reward.function_weights", None))}
        rows = 0
        for arg, key, dataset in (("train_dataset", "data.train_files", train_dataset),
                                  ("eval_dataset", "data.val_files", eval_dataset)):
            if dataset is not None:
                path, count = dataset_file(dataset, arg)
                settings[key] = [str(path)]
                rows = rows or count
        settings.update(config or {})
        cfg = load_train_config(None, [f"{k}={json.dumps(v)}" for k, v in settings.items()])
        steps = step_count(given, cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, cfg.actor.ppo_epochs, rows)
        if steps is not None and "trainer.total_training_steps" not in (config or {}):
            cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_training_steps=steps))
        if cfg.backend != "local":  # the reward worker runs elsewhere: it calls this process's callables here
            functions = serve_from_driver(cfg.reward.functions, driver_host(cfg.backend))
            cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, functions=functions))
        self.cfg: Config = cfg

    def train(self) -> Path:
        """Train as `asyncrl train` would with this config; returns the run's output directory.
        Ends with the CLI's line, "done: N steps in T s; outputs in DIR"."""
        from asyncrl.config.keys import settings_line
        from asyncrl.pipelines import run_pipeline
        from asyncrl.pipelines.rundir import RUNS_ROOT, with_run_dir
        from asyncrl.pipelines.setup import build_context
        from asyncrl.preflight import preflight
        from asyncrl.telemetry.logs import setup_logging

        setup_logging("INFO")
        log = logging.getLogger("asyncrl.api")
        for note in self.notes:
            log.warning(note)
        preflight(self.cfg, log.warning, RUNS_ROOT)
        cfg = with_run_dir(self.cfg)
        log.info(settings_line(cfg))
        start = time.perf_counter()
        ctx = build_context(cfg, started=True)
        step = run_pipeline(ctx)
        log.info(f"done: {step} steps in {time.perf_counter() - start:.1f} s; outputs in {ctx.output_dir}")
        return Path(ctx.output_dir)


class GRPOTrainer(Trainer):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, ...)`, positions and
    names as TRL's; its arguments with no asyncrl counterpart are refused unless left at None."""

    def __init__(self, model: str, reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
                 args: GRPOConfig | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, reward_processing_classes: Any = None, callbacks: Any = None,
                 optimizers: Any = (None, None), quantization_config: Any = None, peft_config: Any = None,
                 tools: Any = None, rollout_func: Any = None, environment_factory: Any = None, *,
                 config: Mapping[str, Any] | None = None) -> None:
        if not isinstance(model, (str, Path)):
            raise ConfigError("GRPOTrainer(model=...): give the model's directory or hub id (asyncrl loads it "
                              "itself), not a model object")
        unused = {"processing_class": processing_class, "reward_processing_classes": reward_processing_classes,
                  "callbacks": callbacks, "quantization_config": quantization_config, "tools": tools,
                  "rollout_func": rollout_func, "environment_factory": environment_factory}
        refused = [name for name, value in unused.items() if value is not None]
        refused += ["optimizers"] if tuple(optimizers) != (None, None) else []
        if refused:
            raise ConfigError(f"GRPOTrainer({', '.join(refused)}=...): asyncrl has no counterpart (the tokenizer "
                              f"comes with the model; tools run as rollout.multi_turn episodes); leave it out")
        super().__init__(str(model), reward_funcs or (), train_dataset, eval_dataset, args=args,
                         config={**peft_settings(peft_config), **(config or {})})


def reward_settings(funcs: Sequence[RewardFunc], weights: Sequence[float] | None) -> dict[str, Any]:
    """reward.* keys for TRL's reward_funcs: functions, and a model directory or hub id (a string
    without ':') as the learned reward model, each with its weight."""
    models = [i for i, f in enumerate(funcs) if isinstance(f, (str, Path)) and ":" not in str(f)]
    if len(models) > 1:
        raise ConfigError(f"reward_funcs: {len(models)} reward models given; asyncrl adds one (reward.model_path) "
                          f"to the reward functions")
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward_funcs; give one each")
    settings: dict[str, Any] = {}
    specs = [function_spec(f) for i, f in enumerate(funcs) if i not in models]
    if specs:
        settings["reward.functions"] = specs
        if weights is not None:
            settings["reward.function_weights"] = [w for i, w in enumerate(weights) if i not in models]
    if models:
        settings["reward.model_path"] = str(funcs[models[0]])
        settings["reward.model_weight"] = 1.0 if weights is None else weights[models[0]]
        if not specs:  # TRL's reward is the model's score alone
            settings["reward.rule_weight"] = 0.0
    return settings


def peft_settings(peft_config: Any) -> dict[str, Any]:
    """model.lora_* keys for a peft `LoraConfig` (TRL's peft_config)."""
    if peft_config is None:
        return {}
    modules = getattr(peft_config, "target_modules", None)
    settings: dict[str, Any] = {"model.lora_rank": int(peft_config.r), "model.lora_alpha": int(peft_config.lora_alpha)}
    if modules:
        settings["model.target_modules"] = [modules] if isinstance(modules, str) else sorted(modules)
    return settings


def driver_host(backend: str) -> str:
    """The address reward workers reach this process on: loopback, unless Ray may place them on
    other nodes (a cluster named by RAY_ADDRESS, or one this process already joined): then this
    node's cluster IP. A Ray cluster asyncrl starts itself has this node alone."""
    if backend != "ray":
        return "127.0.0.1"
    import ray  # the ray backend has it
    import ray.util

    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address())


def function_spec(fn: RewardFunc) -> str:
    """'module:fn' for a function importable by that name, else this process's name for the callable."""
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "." not in name and "<" not in name:
        try:
            if getattr(importlib.import_module(module), name, None) is fn:
                return f"{module}:{name}"
        except ImportError:
            pass
    return register_callable(fn)


def dataset_file(dataset: Any, key: str) -> tuple[Path, int]:
    """The rows as a verl-layout JSONL under the cache, named by their content (written once), and
    their number; `key` is the argument that gave them (train_dataset, eval_dataset)."""
    records = [verl_record(row, i, key) for i, row in enumerate(_rows(dataset, key))]
    if not records:
        raise DataError(f"{key}: the dataset has no rows")
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    path = cache_dir() / "datasets" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path, len(records)


def _rows(dataset: Any, key: str) -> Iterable[Mapping[str, Any]]:
    if isinstance(dataset, (str, Path)):
        raise DataError(f"{key}: give a datasets.Dataset or a list of dicts here; a file path goes in "
                        f"config={{'{FILE_KEYS[key]}': ['{dataset}']}}")
    if not isinstance(dataset, Iterable):
        raise DataError(f"{key}: expected a datasets.Dataset or a list of dicts, got {type(dataset).__name__}")
    return dataset  # a datasets.Dataset iterates as dicts: no import of datasets needed


def verl_record(row: Mapping[str, Any], index: int, key: str) -> dict[str, Any]:
    """A TRL row (prompt + columns) in the verl layout; its other columns become extra_info."""
    if not isinstance(row, Mapping) or "prompt" not in row:
        raise DataError(f"{key}: row {index} has no 'prompt' column (a string or a list of messages)")
    columns = {k: v for k, v in row.items() if k not in ("prompt", "data_source", "reward_model", "extra_info")}
    extra = {**columns, **(row.get("extra_info") or {})}
    for name, value in extra.items():
        try:
            json.dumps(value)
        except TypeError:
            raise DataError(f"{key}: row {index}, column {name!r}: {type(value).__name__} is not "
                            f"JSON-serialisable; drop or convert the column") from None
    truth = (row.get("reward_model") or {}).get("ground_truth", row.get("ground_truth", ""))
    return {"data_source": row.get("data_source", "trl"), "prompt": row["prompt"],
            "reward_model": {"ground_truth": truth}, "extra_info": extra}
