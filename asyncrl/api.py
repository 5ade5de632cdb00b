"""The Python API, for TRL users: `Trainer(model, reward_funcs, train_dataset, ...).train()`.

    from asyncrl import Trainer

    def accuracy(prompts, completions, answer, **kwargs):         # TRL's reward signature
        return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    Trainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=accuracy, train_dataset=dataset,
            learning_rate=1e-6, num_generations=8, max_completion_length=256,
            config={"pipeline": "fully_async", "trainer.device": "cuda"}).train()

What it takes, and what it does with it:
- keyword arguments with `GRPOConfig`'s names (`TRL_KEYS`: learning_rate, num_generations, ...;
  `beta` > 0 turns on the k3 KL loss as TRL's does), and `config`, a mapping of asyncrl's dotted
  keys (or verl's); both become the overrides of `asyncrl train`, validated the same way;
- `train_dataset` / `eval_dataset`: a `datasets.Dataset` or a list of dicts with a `prompt` column,
  a string (TRL's standard format: raw text, no chat template) or a list of messages (its
  conversational format: the chat template). The other columns reach the reward functions as
  keyword arguments (and `extra_info`). Rows are written once to a JSONL file named by their
  content under the asyncrl cache (`$ASYNCRL_CACHE/datasets`), so a rerun resumes with the same
  config;
- `reward_funcs`: TRL-signature functions (`asyncrl.rewards.batch_functions`), or 'module:fn'
  names; `reward_weights` their weights. A function importable by name is named so and runs
  where the other reward work runs, the reward worker's process pool; any other callable (a
  lambda, a closure, one defined in a notebook or a script's `__main__`) runs in a thread pool of
  this process, on every backend (a reward worker in another process calls it here,
  `asyncrl.rewards.driver_calls`).

It runs `asyncrl train`'s own path (preflight, then the pipeline); nothing here is a second loop.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.config.load import load_train_config
from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError, DataError
from asyncrl.models.cache import cache_dir
from asyncrl.rewards.batch_functions import register_callable, serve_from_driver

TRL_KEYS = {
    "learning_rate": "actor.lr", "lr_scheduler_type": "actor.lr_scheduler", "warmup_ratio": "actor.warmup_ratio",
    "warmup_steps": "actor.warmup_steps", "weight_decay": "actor.weight_decay", "max_grad_norm": "actor.grad_clip",
    "num_generations": "rollout.n", "max_prompt_length": "data.max_prompt_length",
    "max_completion_length": "data.max_response_length", "temperature": "rollout.temperature",
    "top_p": "rollout.top_p", "top_k": "rollout.top_k", "epsilon": "actor.clip_ratio_low",
    "epsilon_high": "actor.clip_ratio_high", "num_iterations": "actor.ppo_epochs",
    "max_steps": "trainer.total_training_steps", "gradient_checkpointing": "model.enable_gradient_checkpointing",
    "output_dir": "trainer.output_dir", "save_steps": "trainer.save_freq", "report_to": "trainer.logger",
    "lora_r": "model.lora_rank", "lora_alpha": "model.lora_alpha", "seed": "seed",
}
"""TRL `GRPOConfig` names that mean exactly one asyncrl key (docs/migrating.md's table has the rest)."""

RewardFunc = Callable[..., Sequence[float | None]] | str


class Trainer:
    """One run from Python: the config is resolved (and checked) when built, trained by `train()`."""

    def __init__(self, model: str = "tiny", reward_funcs: RewardFunc | Sequence[RewardFunc] = (),
                 train_dataset: Any = None, eval_dataset: Any = None, *,
                 reward_weights: Sequence[float] | None = None, config: Mapping[str, Any] | None = None,
                 **trl_args: Any) -> None:
        funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
        settings: dict[str, Any] = {"model.path": model, **trl_settings(trl_args), **(config or {})}
        if funcs:
            settings["reward.functions"] = [function_spec(f) for f in funcs]
        if reward_weights is not None:
            settings["reward.function_weights"] = list(reward_weights)
        for key, dataset in (("data.train_files", train_dataset), ("data.val_files", eval_dataset)):
            if dataset is not None:
                settings[key] = [str(dataset_file(dataset, key))]
        cfg = load_train_config(None, [f"{k}={json.dumps(v)}" for k, v in settings.items()])
        if cfg.backend != "local":  # the reward worker runs elsewhere: it calls this process's callables here
            functions = serve_from_driver(cfg.reward.functions, driver_host(cfg.backend))
            cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, functions=functions))
        self.cfg: Config = cfg

    def train(self) -> Path:
        """Train as `asyncrl train` would with this config; returns the run's output directory."""
        from asyncrl.pipelines import run_pipeline
        from asyncrl.pipelines.rundir import RUNS_ROOT
        from asyncrl.pipelines.setup import build_context
        from asyncrl.preflight import preflight
        from asyncrl.telemetry.logs import setup_logging

        setup_logging("INFO")
        preflight(self.cfg, logging.getLogger("asyncrl.api").warning, RUNS_ROOT)
        ctx = build_context(self.cfg)
        run_pipeline(ctx)
        return Path(ctx.output_dir)


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


def trl_settings(trl_args: Mapping[str, Any]) -> dict[str, Any]:
    """asyncrl keys for TRL `GRPOConfig` arguments; an unknown name is one line with the closest."""
    settings: dict[str, Any] = {}
    for name, value in trl_args.items():
        if name == "beta":  # TRL: 0 = no reference model; otherwise the k3 estimator in the loss
            settings.update({"actor.use_kl_loss": value > 0, "actor.kl_loss_coef": value, "actor.kl_loss_type": "k3"})
        elif name in TRL_KEYS:
            settings[TRL_KEYS[name]] = value
        else:
            close = difflib.get_close_matches(name, [*TRL_KEYS, "beta"], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"Trainer({name}=...): not a GRPOConfig name asyncrl maps; {hint}other keys go in "
                              f"config={{'actor.lr': ...}} with asyncrl's or verl's dotted names")
    return settings


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


def dataset_file(dataset: Any, key: str) -> Path:
    """The rows as a verl-layout JSONL under the cache, named by their content (written once)."""
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
    return path


def _rows(dataset: Any, key: str) -> Iterable[Mapping[str, Any]]:
    if isinstance(dataset, (str, Path)):
        raise DataError(f"{key}: give a datasets.Dataset or a list of dicts here; a file path goes in "
                        f"config={{'{key}': ['{dataset}']}}")
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
