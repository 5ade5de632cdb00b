"""An endless, resumable prompt stream over epochs.

`PromptIterator` hands out prompts one at a time (`take`) or a batch at a time (`next_batch`),
both through one cursor, so synchronous and streaming pipelines see the same order. Epochs
chain without a break: a batch may span an epoch boundary. Epoch e is a permutation drawn
with `random.Random(seed + e)`, so the order depends only on (seed, epoch, len(rows)).

It is also the ledger of prompts handed out: a prompt is *outstanding* from `next_prompt` until
the pipeline says it is `done` (trained, or consumed by dynamic sampling) or hands it back
(`give_back`: generate it again). `state_dict()` is (epoch, cursor) plus the outstanding
prompts' uids, and a restored iterator hands those out again first, in their order, so a run
resumed from a checkpoint trains exactly the prompts the checkpoint's weights were not trained
on: none lost, none twice.

It does not tokenize, filter or load data, and it never drops the tail of an epoch.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
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
        self._by_uid = {r.uid: r for r in self._rows}
        self._epoch = 0
        self._cursor = 0
        self._order = self._permutation(0)
        self._out: list[PromptRow] = []
        """Handed out and not yet done, oldest first."""
        self._replay: deque[PromptRow] = deque()
        """Handed back (or outstanding at a restored checkpoint): handed out again first."""

    @property
    def epoch(self) -> int:
        """The (0-based) epoch the next prompt comes from."""
        return self._epoch

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def has_replay(self) -> bool:
        """Whether prompts handed back wait to be handed out again."""
        return bool(self._replay)

    @property
    def outstanding(self) -> list[PromptRow]:
        """Prompts handed out and not done, then those waiting to be handed out again."""
        return [*self._out, *self._replay]

    def next_prompt(self) -> PromptRow:
        """A handed-back prompt if any, else the next one of the stream (advancing to the next
        epoch when this one is exhausted)."""
        row = self._replay.popleft() if self._replay else self._draw()
        self._out.append(row)
        return row

    def done(self, rows: Iterable[PromptRow]) -> None:
        """These prompts are trained (or consumed): a checkpoint no longer lists them."""
        for row in rows:
            self._out.remove(row)

    def give_back(self, row: PromptRow) -> None:
        """Generate this outstanding prompt again (its group was dropped or aborted)."""
        self._out.remove(row)
        self._replay.append(row)

    def claim(self, row: PromptRow) -> None:
        """A prompt waiting to be handed out again is outstanding once more (its group was
        restored from a checkpoint instead of generated again)."""
        self._replay.remove(row)
        self._out.append(row)

    def _draw(self) -> PromptRow:
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
                "shuffle": self.shuffle, "num_rows": len(self._rows),
                "outstanding": [r.uid for r in self.outstanding]}

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
        self._out = []
        self._replay = deque(self._by_uid[uid] for uid in state.get("outstanding", ()))

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order
