"""The built-in models warmed up on one task, `tiny-countdown` and `tiny-longtail`: their specs.

Each is tiny's architecture and character tokenizer warmed up by SFT on its task's train split
with label noise (`asyncrl.models.tiny_task` builds it), so RL on that task starts low but clearly
improvable, as `tiny` does on arithmetic. A spec carries the task options the model was warmed
up on; a run on the model passes the same ones as `data.task_options` (`run_overrides()`), so the
train and validation prompts are the ones it knows.

This module imports neither torch nor transformers: the loader's name checks and the benchmarks
read it cheaply. Not here: the warm-up itself (`tiny_task`), `tiny` and `tiny-tools`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from asyncrl.models import cache


@dataclass(frozen=True)
class TaskModelSpec:
    """A tiny model warmed up on one built-in task; its hash names the cache directory."""

    name: str
    """`model.path=` of this model."""
    task: str
    """The built-in task (`data.task`) it is warmed up on."""
    options: tuple[tuple[str, Any], ...] = ()
    """The task's options (`data.task_options`), as (name, value) pairs."""
    label_noise: float = 0.5
    """Share of SFT targets perturbed (`tiny_task.TARGETS`): the right answer stays the mode, samples spread."""
    target_score: float = 0.6
    """Warm-up stops once the greedy mean score on a train-split probe reaches this."""
    max_new_tokens: int = 16
    """Generated tokens at most when probing (the longest right answer and its end token)."""
    warmup_max_steps: int = 600
    warmup_batch: int = 32
    warmup_lr: float = 1e-3
    probe_size: int = 64
    probe_from: int = 50
    probe_every: int = 10
    max_positions: int = 512
    seed: int = 0

    def task_options(self) -> dict[str, Any]:
        return dict(self.options)

    def options_override(self) -> str:
        """`data.task_options=[...]` of these options, each `name=value` with the value as JSON (read
        back as YAML). Example: `data.task_options=["counts=[2]", "max_number=12"]`."""
        entries = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.options]
        return f"data.task_options={json.dumps(entries)}"

    def run_overrides(self) -> list[str]:
        """The keys of a run on this model: its path, its task and the task's options."""
        return [f"model.path={self.name}", f"data.task={self.task}", self.options_override()]

    def arch(self) -> dict[str, Any]:
        """`TinySpec`'s fields of the architecture (tiny's layers, these positions and seed)."""
        return {"max_positions": self.max_positions, "seed": self.seed}

    def cache_name(self) -> str:
        """The cache directory's name before its hash: `tiny_countdown` (a `tiny-*` glob is tiny's)."""
        return self.name.replace("-", "_")

    def key(self) -> str:
        fields = {"task_model": asdict(self), "arch": self.arch(), "profile": cache.profile()}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return f"{self.cache_name()}-{digest[:12]}"


COUNTDOWN = TaskModelSpec(
    name="tiny-countdown", task="countdown",
    options=(("counts", (2,)), ("max_number", 9), ("max_target", 18), ("ops", "+-"), ("prompt", "short")),
    label_noise=0.3, target_score=0.5, max_new_tokens=8, warmup_max_steps=1000, warmup_batch=8,
    warmup_lr=1e-3, probe_size=32, probe_from=100, probe_every=50)
"""Two one-digit numbers joined by + or -, in the short prompt ("Make 8 from [3, 5]."): the model
copies the numbers and picks the operation; its SFT answers are the task's constructed solutions,
written bare (the scorer reads the last line), 30% with the operation flipped
(`tiny_task.countdown_target`). Copying from the full prompt's ~180 characters had not appeared
after 1,600 warm-up steps (batches 8-32, lr 1e-3-2e-3); from the short prompt it appears after ~250
steps of 8 at lr 1e-3 (about 10 s on one core; 950 steps of 16 at 2e-3)."""

LONGTAIL = TaskModelSpec(
    name="tiny-longtail", task="longtail",
    options=(("median", 12.0), ("sigma", 1.0), ("max_len", 192)),
    label_noise=0.5, target_score=0.3, max_new_tokens=200, warmup_max_steps=1500, warmup_lr=2e-3,
    probe_size=32, probe_from=300, probe_every=100)
"""Lognormal lengths, median 12 and 1% past ~120 letters, capped at 192 (affordable on 2 CPU
cores); the model reads k and stops by itself; noisy target lengths (half of them, by up to a quarter
of k) spread its samples around k. Counting appears abruptly and unsteadily at lr 2e-3 (greedy score
0.00 at step 500, 0.32 at 600, 0.02 at 700, 0.18 at 800), so warm-up stops at the first probe past
0.3: step 600, about 125 s on one core."""

TASK_MODELS: dict[str, TaskModelSpec] = {s.name: s for s in (COUNTDOWN, LONGTAIL)}
"""`model.path` -> spec of the built-in models warmed up on one task."""
