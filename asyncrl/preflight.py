"""Checks that `asyncrl train` runs right after the config loads, before any model, Ray or worker.

`preflight(cfg, log, runs_root)` takes about a second and turns the mistakes that used to surface minutes
into a run, as tracebacks, into one `ConfigError`/`DataError` line naming the key that fixes it:

- every `trainer.logger` has its package installed (the extra to install is named);
- `trainer.device=cuda` has a CUDA device to run on;
- the output directory (`trainer.output_dir`, or `runs_root` where run directories are made when
  it is empty: the caller's `asyncrl.pipelines.rundir.RUNS_ROOT`) can be created and written, and
  its disk is not full (a warning under 1 GiB free);
- every `data.train_files`/`data.val_files` exists, has a supported suffix and only well-formed
  rows (the loader's own checks, `asyncrl.data.dataset.load_rows`);
- `model.path` is a built-in model or a directory with a config, weights and a tokenizer, and a
  prompt plus its response fit its positions;
- `data.max_prompt_length` keeps the prompts (counted with the model's `tokenizer.json` and chat
  template, the same way the loader tokenizes them), and enough of them for one batch;
- the reward function resolves: `reward.custom_function`, else the built-in scorer of every
  `data_source` in the data files; `reward.model_path` is a one-label sequence classifier.

It loads no model and starts nothing. What it cannot check cheaply (prompt lengths under a
tokenizer without `tokenizer.json`, or a built-in model not cached yet) the loader checks later,
with the same messages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from asyncrl.config.schema import Config, DataConfig, RewardConfig
from asyncrl.config.validate import check_pipeline_keys
from asyncrl.data.dataset import SUPPORTED_SUFFIXES, check_prompt_lengths, load_rows
from asyncrl.data.tokenization import template_kwargs
from asyncrl.errors import ConfigError
from asyncrl.fsutil import nearest_unwritable
from asyncrl.models.loading import check_model_path, local_tokenizer_dir, model_positions
from asyncrl.rewards import check_signature
from asyncrl.rewards.batch_functions import resolve as resolve_batch_function
from asyncrl.rewards.registry import load_custom_function, resolve_reward_fn
from asyncrl.rewards.reward_model import check_reward_model_path
from asyncrl.telemetry.loggers import missing_logger_package
from asyncrl.types import PromptRow

LOW_DISK_BYTES = 1 << 30
"""Below this much free space under the output directory, warn: checkpoints may not fit."""
SAMPLE_ROWS = 512
"""Prompts counted per data file at first (see `_count_dropped`), so preflight stays near a second."""

Log = Callable[[str], None]
LengthCounter = Callable[[Sequence[PromptRow]], "list[int] | None"]


class DataFile(NamedTuple):
    key: str
    """data.train_files or data.val_files."""
    path: str
    rows: list[PromptRow]


def preflight(cfg: Config, log: Log, runs_root: Path) -> None:
    """Raise the first problem found as one line naming its key; log warnings. `runs_root`: where
    run directories are made when `trainer.output_dir` is empty."""
    if problem := missing_logger_package(cfg.trainer.logger):
        raise ConfigError(problem)
    check_output_dir(cfg.trainer.output_dir, runs_root, log)
    check_backend(cfg.backend)
    check_pipeline_keys(cfg)
    check_device(cfg.trainer.device)
    check_model_path(cfg.model.path)
    check_positions(cfg)
    files = check_data_files(cfg.data)
    check_prompt_fit(cfg, files, log)
    check_rewards(cfg.reward, files)
    if cfg.reward.model_path:
        check_reward_model_path(cfg.reward.model_path)
    check_local_counts(cfg, log)  # a warning: after every refusal


def check_backend(backend: str) -> None:
    """backend=ray needs Ray installed (checked without importing it)."""
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("backend=ray needs Ray, which is not installed: pip install 'asyncrl[ray]' "
                          "(or set backend=local)")


def check_local_counts(cfg: Config, log: Log) -> None:
    """backend=local runs one trainer and one rollout engine per rollout.num_engines in this
    process: node and GPU counts above one are named, not silently dropped."""
    if cfg.backend != "local":
        return
    counts = {f"{side}.{name}": getattr(getattr(cfg, side), name) for side in ("trainer", "rollout")
              for name in ("nnodes", "n_gpus_per_node")}
    unused = [f"{key}={value}" for key, value in counts.items() if value > 1]
    if unused:
        log(f"backend=local trains in this process on one device: {', '.join(unused)} not used "
            f"(backend=ray places workers on them; backend=processes trainer.ranks=N for FSDP2 on one machine)")


def check_device(device: str) -> None:
    """`trainer.device=cuda` needs a CUDA build of torch that sees a GPU (torch is imported only then:
    the run's first line comes before that import otherwise)."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise ConfigError(f"trainer.device=cuda but torch sees no CUDA device ({build}): "
                          "set trainer.device=cpu, or run where a GPU and a CUDA build of torch are")


def check_positions(cfg: Config) -> None:
    """A prompt and its response fit the model's positions (`max_position_embeddings`, or the
    `model.max_position_embeddings` override), where its saved config says how many it has."""
    positions = cfg.model.max_position_embeddings or model_positions(cfg.model.path)
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if positions is not None and need > positions:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {need} > the {positions} positions of "
                          f"model.path={cfg.model.path}: lower them, or raise model.max_position_embeddings "
                          f"(verl's override_config.max_position_embeddings) for a model that extrapolates")


def check_output_dir(output_dir: str, runs_root: Path, log: Log) -> None:
    """The output directory (`runs_root` when empty; or the nearest part of it that exists) is a
    writable directory with space."""
    target = Path(output_dir) if output_dir else runs_root
    key = f"trainer.output_dir={output_dir!r}" + ("" if output_dir else f" (runs go under {runs_root}/)")
    fix = "set trainer.output_dir to a writable directory"
    existing, problem = nearest_unwritable(target)
    if problem:
        raise ConfigError(f"{key}: {problem}; {fix}")
    free = shutil.disk_usage(existing).free
    if free == 0:
        raise ConfigError(f"{key}: the disk of {existing} is full; free space or {fix} on another disk")
    if free < LOW_DISK_BYTES:
        log(f"warning: only {free / 2**30:.2f} GiB free for trainer.output_dir ({existing}); "
            "checkpoints may not fit")


def check_data_files(d: DataConfig) -> list[DataFile]:
    """Every data file with its rows, loaded with the loader's own checks."""
    out: list[DataFile] = []
    for key, split, paths in (("data.train_files", "train", d.train_files), ("data.val_files", "val", d.val_files)):
        for i, path in enumerate(paths):
            if not os.path.isfile(path):
                problem = "is a directory, not a file" if os.path.isdir(path) else "not found"
                raise ConfigError(f"{key}: {path} {problem}")
            if not path.endswith(SUPPORTED_SUFFIXES):
                raise ConfigError(f"{key}: {path} is not a supported data file "
                                  f"(expected {', '.join(SUPPORTED_SUFFIXES)})")
            rows = load_rows(path, split_name=f"{split}{i}")
            if not rows:
                raise ConfigError(f"{key}: {path} has no rows")
            out.append(DataFile(key, path, rows))
    return out


def check_prompt_fit(cfg: Config, files: Sequence[DataFile], log: Log) -> None:
    """No file loses every prompt to data.max_prompt_length, and one batch of training prompts is left."""
    d = cfg.data
    if not files:
        return
    counter = (_prompt_length_counter(cfg.model.path, d.chat_template, template_kwargs(d.chat_template_kwargs))
               if d.filter_overlong_prompts else None)
    n_train = 0
    for f in files:
        dropped = _count_dropped(counter, f, d.max_prompt_length, log) if counter else 0
        n_train += len(f.rows) - dropped if f.key == "data.train_files" else 0
    if d.train_files and n_train < d.train_batch_size:
        within = f" within data.max_prompt_length={d.max_prompt_length}" if counter else ""
        raise ConfigError(f"data.train_files hold {n_train} prompts{within}, fewer than data.train_batch_size="
                          f"{d.train_batch_size}: lower data.train_batch_size or add prompts")


def _count_dropped(counter: LengthCounter, f: DataFile, max_prompt_length: int, log: Log) -> int:
    """Prompts of `f` longer than max_prompt_length, reported by `check_prompt_lengths`. A file of more
    than SAMPLE_ROWS rows is sampled first: when some sampled prompts fit, the loader counts the
    rest exactly later; when none does, every prompt is counted now for an exact error."""
    sample = f.rows[:: -(-len(f.rows) // SAMPLE_ROWS)]
    lengths_N = counter(sample)
    if lengths_N is None:
        return 0
    if len(sample) < len(f.rows):
        if any(n <= max_prompt_length for n in lengths_N):
            return 0
        lengths_N = counter(f.rows) or []
    return check_prompt_lengths(lengths_N, max_prompt_length, f.path, log)


def check_rewards(reward: RewardConfig, files: Sequence[DataFile]) -> None:
    """reward.functions resolve (they score every data source), or reward.custom_function imports, or
    every data_source of the data files has a built-in scorer; none with a reward model alone
    (reward.model_path with reward.rule_weight=0), which runs no rule."""
    if reward.model_path and reward.rule_weight == 0:
        return
    if reward.functions:
        for spec in reward.functions:
            resolve_batch_function(spec)
        return
    if reward.custom_function:
        check_signature(load_custom_function(reward.custom_function), reward.custom_function)
        return
    for source in sorted({r.data_source for f in files for r in f.rows}):
        resolve_reward_fn(source)


# ---- prompt lengths without transformers ------------------------------------------------------


def _prompt_length_counter(model_path: str, chat_template: str,
                           extra: dict[str, Any] | None = None) -> LengthCounter | None:
    """Tokens per templated prompt, counted as `tokenization.encode_messages` does (render the chat
    template, encode without adding special tokens), with the `tokenizers` library and jinja2
    directly: importing transformers alone takes longer than all of preflight. None when this
    model's tokenizer is not a local tokenizer.json; the counter returns None when a template
    does not render here."""
    tok_dir = local_tokenizer_dir(model_path)
    if tok_dir is None:
        return None
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer
    except ImportError:
        return None
    settings = _tokenizer_settings(tok_dir)
    template_text = chat_template or _saved_template(tok_dir, settings)
    if not template_text:
        return None  # the loader names data.chat_template
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_template_error
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    specials = {k: _token_text(settings.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}

    def count(rows: Sequence[PromptRow]) -> list[int] | None:
        try:
            template = env.from_string(template_text)
            texts = [r.text or template.render(messages=[dict(m) for m in r.messages], add_generation_prompt=True,
                                               **specials, **(extra or {})) for r in rows]
        except Exception:  # a template using transformers-only extensions: leave it to the loader
            return None
        return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    return count


def _tokenizer_settings(tok_dir: Path) -> dict[str, Any]:
    try:
        settings = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


def _saved_template(tok_dir: Path, settings: dict[str, Any]) -> str:
    """The chat template saved beside the tokenizer: chat_template.jinja (transformers >= 4.43), else
    tokenizer_config.json's `chat_template` (a string, or a list of named ones: "default")."""
    path = tok_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    saved = settings.get("chat_template") or ""
    if isinstance(saved, list):
        named = {t.get("name"): t.get("template") for t in saved if isinstance(t, dict)}
        saved = named.get("default") or ""
    return saved if isinstance(saved, str) else ""


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _raise_template_error(message: str) -> None:
    raise ValueError(message)
