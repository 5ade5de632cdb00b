"""Built-in generated tasks, deterministic by seed, in the verl row layout.

`make_task(name, n, seed=, split=, **kwargs)` looks the task up in `TASKS`; `write_parquet` /
`write_jsonl` save rows so that `asyncrl.data.dataset.load_rows(path, split_name=split)` reads
back equal rows. Prompt formats are documented in each task module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.data.dataset import write_jsonl, write_parquet
from asyncrl.data.tasks.arithmetic import make_arithmetic
from asyncrl.data.tasks.code import make_code
from asyncrl.data.tasks.countdown import make_countdown
from asyncrl.data.tasks.long_addition import make_long_addition
from asyncrl.data.tasks.longtail import make_longtail
from asyncrl.types import PromptRow

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


__all__ = ["TASKS", "make_task", "write_jsonl", "write_parquet"]
