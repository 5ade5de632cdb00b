"""An endless, resumable prompt stream over epochs.

`PromptIterator` hands out prompts one at a time (`take`) or a batch at a time (`next_batch`),
both through one cursor, so synchronous and streaming pipelines see the same order. Epochs
chain without a break: a batch may span an epoch boundary. Epoch e is a permutation drawn
with `random.Random(seed + e)`, so the order depends only on (seed, epoch, len(rows)), and
`state_dict()` is just (epoch, cursor): a restored iterator yields exactly the same prompts.

It does not tokenize, filter or load data, and it never drops the tail of an epoch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from asyncrl.errors import DataError
from asyncrl.types import PromptRow


class PromptIterator:
    """Continuous prompt stream over epochs.

    Example: rows r0..r4, batch_size 2, shuffle=False yields [r0, r1], [r2, r3], [r4, r0]
    (the third batch spans the boundary; `epoch` is 1 after it).
    """

    def __init__(self, rows: Sequence[PromptRow], batch_size: int, *, shuffle: bool = True, seed: int = 0):
        if not rows:
            raise DataError("no prompts to iterate over (is the data file empty, or did "
                            "data.max_prompt_length filter every prompt?)")
        assert batch_size > 0, batch_size
        self._rows = list(rows)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._epoch = 0
        self._cursor = 0
        self._order = self._permutation(0)

    @property
    def epoch(self) -> int:
        """The (0-based) epoch the next prompt comes from."""
        return self._epoch

    def __len__(self) -> int:
        return len(self._rows)

    def next_prompt(self) -> PromptRow:
        """The next single prompt (advancing to the next epoch when this one is exhausted)."""
        row = self._rows[self._order[self._cursor]]
        self._cursor += 1
        if self._cursor == len(self._rows):
            self._epoch += 1
            self._cursor = 0
            self._order = self._permutation(self._epoch)
        return row

    def take(self, k: int) -> list[PromptRow]:
        """The next k prompts, one by one through the same cursor as `next_batch`."""
        return [self.next_prompt() for _ in range(k)]

    def next_batch(self) -> list[PromptRow]:
        """The next `batch_size` prompts; may span an epoch boundary."""
        return self.take(self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "cursor": self._cursor, "seed": self.seed,
                "shuffle": self.shuffle, "num_rows": len(self._rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`; the dataset must be the same size (and order) as when saved."""
        if state["num_rows"] != len(self._rows):
            raise DataError(
                f"cannot resume the prompt iterator: the checkpoint was taken over "
                f"{state['num_rows']} prompts but the dataset now has {len(self._rows)} "
                f"(did data.train_files or data.max_prompt_length change?)"
            )
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._order = self._permutation(self._epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order
