"""Helpers shared by the built-in generated tasks: seeding, train/test partition, row building.

Every task draws from `task_rng(name, seed, split)`, so a (task, seed, split) triple always gives
the same rows, and different splits are seeded differently. Tasks with a discrete item space
also call `in_split(key, split)`: an item belongs to the held-out side ("test" or any split other
than "train") iff crc32(key) % 8 == 0, so train and test items are disjoint by construction.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from asyncrl.types import PromptRow

T = TypeVar("T")

HELD_OUT_BUCKETS = 8
MAX_TRIES = 10_000


def task_rng(name: str, seed: int, split: str) -> random.Random:
    """A generator seeded from (task, seed, split); str seeds hash deterministically (sha512)."""
    return random.Random(f"{name}:{split}:{seed}")


def in_split(key: str, split: str) -> bool:
    """Whether an item with this key belongs to `split` (train vs held-out partition)."""
    held_out = zlib.crc32(key.encode()) % HELD_OUT_BUCKETS == 0
    return held_out == (split != "train")


def draw_in_split(draw: Callable[[], T], key: Callable[[T], str], split: str) -> T:
    """Draw items until one falls in `split`'s partition."""
    for _ in range(MAX_TRIES):
        item = draw()
        if in_split(key(item), split):
            return item
    raise ValueError(f"no item for split '{split}' in {MAX_TRIES} draws: widen the task's ranges")


def make_row(
    *, split: str, index: int, data_source: str, prompt: str, ground_truth: str,
    ability: str, extra: dict[str, Any] | None = None,
) -> PromptRow:
    """One user-message row with uid `f"{split}-{index}"` and `extra_info.index == index`."""
    return PromptRow(
        uid=f"{split}-{index}",
        data_source=data_source,
        messages=({"role": "user", "content": prompt},),
        ground_truth=ground_truth,
        ability=ability,
        extra_info={"index": index, "split": split, **(extra or {})},
    )
