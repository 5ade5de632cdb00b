"""Built-in generated tasks, deterministic by seed, in the verl row layout.

`make_task(name, n, seed=, split=, **kwargs)` looks the task up in `TASKS`; `task_rows` makes a
run's rows from its `data.task` and `data.task_options` (`task_options`); `write_parquet` /
`write_jsonl` save rows so that `asyncrl.data.dataset.load_rows(path, split_name=split)` reads
back equal rows. Prompt formats are documented in each task module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from asyncrl.data.dataset import write_jsonl, write_parquet
from asyncrl.data.tasks.arithmetic import make_arithmetic
from asyncrl.data.tasks.code import make_code
from asyncrl.data.tasks.countdown import make_countdown
from asyncrl.data.tasks.long_addition import make_long_addition
from asyncrl.data.tasks.longtail import make_longtail
from asyncrl.errors import ConfigError
from asyncrl.types import PromptRow

if TYPE_CHECKING:
    from asyncrl.config.schema import DataConfig

TaskFn = Callable[..., list[PromptRow]]

TASKS: dict[str, TaskFn] = {
    "arithmetic": make_arithmetic,
    "countdown": make_countdown,
    "code": make_code,
    "longtail": make_longtail,
    "long_addition": make_long_addition,
}


def make_task(name: str, n: int, *, seed: int = 0, split: str = "train", **kwargs: Any) -> list[PromptRow]:
    """n rows of built-in task `name`; kwargs go to the task (e.g. `ops=("+", "-")`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; built-in tasks are {sorted(TASKS)}")
    return TASKS[name](n, seed=seed, split=split, **kwargs)


def task_options(name: str, entries: Sequence[str]) -> dict[str, Any]:
    """`data.task_options` as task `name`'s keyword arguments, each value read as YAML:
    ["counts=[2]", "max_number=12"] -> {"counts": [2], "max_number": 12}. A ConfigError naming the
    key for an entry not shaped name=value or an option the task does not take."""
    import yaml

    known = [p for p in inspect.signature(TASKS[name]).parameters if p not in ("n", "seed", "split")]
    out: dict[str, Any] = {}
    for entry in entries:
        option, sep, value = entry.partition("=")
        if not sep or option not in known:
            raise ConfigError(f"data.task_options: {entry!r} is not name=value with a name data.task={name} "
                              f"takes ({', '.join(known)})")
        try:
            out[option] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"data.task_options: {entry!r}: the value is not valid YAML") from None
    return out


def task_rows(d: DataConfig, n: int, *, seed: int, split: str) -> list[PromptRow]:
    """n rows of the run's built-in task (`data.task`, with `data.task_options`); a value the task
    refuses is a ConfigError naming data.task_options."""
    options = task_options(d.task, d.task_options)
    try:
        return make_task(d.task, n, seed=seed, split=split, **options)
    except (TypeError, ValueError, AssertionError) as exc:
        if not options:
            raise
        raise ConfigError(f"data.task_options={list(d.task_options)} do not make data.task={d.task} prompts: "
                          f"{' '.join(str(exc).split()) or type(exc).__name__}") from None


__all__ = ["TASKS", "make_task", "task_options", "task_rows", "write_jsonl", "write_parquet"]
