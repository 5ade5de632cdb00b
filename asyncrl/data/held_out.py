"""The held-out prompts of a config, loaded one way for a run's validation
(`asyncrl.workers.factory.load_data`) and for `asyncrl eval`, so both score the same prompts:
`data.val_files`, or the built-in task's test split when there are none, tokenized with
`data.chat_template`, the prompts longer than `data.max_prompt_length` dropped or cut
(`data.filter_overlong_prompts`, `data.truncation`; counted and reported, naming the keys).

It does not decide whether a run validates at all (the factory skips validation when a run
trains on its own files and names no val_files) and it generates nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from asyncrl.data.dataset import fit_prompts, load_rows
from asyncrl.data.tasks import task_rows
from asyncrl.data.tokenization import template_kwargs, tokenize_rows
from asyncrl.types import PromptRow

if TYPE_CHECKING:
    from asyncrl.config.schema import DataConfig


def val_rows(d: DataConfig, seed: int, tok: Any, log: Callable[[str], None]) -> tuple[list[PromptRow], list[str]]:
    """The tokenized held-out rows that fit data.max_prompt_length, and where they came from
    (the files, or `data.task=<task> (test split)`)."""
    if d.val_files:
        sources = [(f, load_rows(f, split_name=f"val{i}")) for i, f in enumerate(d.val_files)]
    else:
        sources = [(f"data.task={d.task} (test split)", task_rows(d, d.val_size, seed=seed, split="test"))]
    rows = [r for source, raw in sources for r in prompt_rows(raw, d, tok, source, log)]
    return rows, [source for source, _ in sources]


def prompt_rows(raw: Sequence[PromptRow], d: DataConfig, tok: Any, source: str,
                log: Callable[[str], None]) -> list[PromptRow]:
    """`raw` tokenized, within data.max_prompt_length (the longer dropped or cut, counted, naming the keys)."""
    tokenized, _ = tokenize_rows(raw, tok, sys.maxsize, chat_template=d.chat_template or None,
                                 template_kwargs=template_kwargs(d.chat_template_kwargs))
    return fit_prompts(tokenized, d.max_prompt_length, source, log, filter_overlong=d.filter_overlong_prompts,
                       truncation=d.truncation)
