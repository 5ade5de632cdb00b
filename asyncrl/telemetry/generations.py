"""What the model generated, readable: `generations.jsonl` and the text tables of TensorBoard and W&B.

A training step logs `trainer.log_generations` of the responses it trained on (16 by default;
0 = off), a validation `trainer.log_val_generations` of its responses (-1, the default: all).
`pick` chooses them: whole groups (a prompt's responses side by side, as the advantage compares
them) in a seeded random order of the batch's groups, `random.Random(f"{seed}/{split}/{step}")`,
until k responses, the last group cut to fit; listed in batch order. A seeded order rather than
the batch's first groups, because in fully async runs the first groups to finish are those with
the shortest responses. `records` turns them into one JSON-ready dict per response (`FIELDS`):
prompt and response decoded without special tokens (as verl's `rollout_data_dir` dumps them),
reward and its parts, the policy versions that produced it, the step.

`telemetry.loggers.GenerationsLog` appends them to `generations.jsonl` (`trainer.rollout_data_dir`
for training, `trainer.validation_data_dir` for validation, each defaulting to the run
directory); a run resumed from step K first drops the lines of steps after K, as metrics.jsonl
does. `table_rows` and `markdown_table` are the small tables W&B and TensorBoard show.

Not here: deciding when a step's groups are logged (`pipelines.common.after_step` and
`run_validation`), the sinks themselves (`telemetry.loggers`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from asyncrl.fsutil import atomic_write_text
from asyncrl.types import Group, Trajectory

Split = Literal["train", "val"]
GENERATIONS_FILE = "generations.jsonl"
FIELDS = ("step", "split", "group", "sample", "data_source", "prompt", "response", "ground_truth", "reward",
          "reward_parts", "reward_status", "finish_reason", "response_tokens", "start_version", "end_version")
"""The keys of each line, in order."""
TABLE_ROWS = 16
"""Rows of a TensorBoard or W&B table (the JSONL file has every record)."""
CELL_CHARS = 1000
"""Characters of a prompt or response shown in a table cell (the JSONL file has the whole text)."""
Picked = list[tuple[Group, list[Trajectory]]]


def pick(groups: Sequence[Group], k: int, key: str) -> Picked:
    """k responses as whole groups in the seeded order `random.Random(key)` gives the groups, the
    last group cut to fit, listed in batch order; k < 0: every response. Example: groups of 4,
    k = 6: one group whole and two responses of another."""
    if k < 0:
        return [(g, list(g.trajectories)) for g in groups]
    order = list(range(len(groups)))
    random.Random(key).shuffle(order)
    chosen: dict[int, list[Trajectory]] = {}
    for i in order:
        left = k - sum(len(ts) for ts in chosen.values())
        if left <= 0:
            break
        chosen[i] = list(groups[i].trajectories[:left])
    return [(groups[i], chosen[i]) for i in sorted(chosen)]


def records(picked: Picked, step: int, split: Split, decode: Callable[[Sequence[int]], str]) -> list[dict[str, Any]]:
    """One dict per picked response, keys `FIELDS`; a non-finite reward is null."""
    out = []
    for g, trajectories in picked:
        for t in trajectories:
            first, last, _ = t.version_span()
            out.append({"step": step, "split": split, "group": g.uid, "sample": t.request_id,
                        "data_source": g.row.data_source, "prompt": decode(t.prompt_ids or g.row.prompt_ids),
                        "response": decode(t.response_ids), "ground_truth": g.row.ground_truth,
                        "reward": _finite(t.reward),
                        "reward_parts": {k: _finite(v) for k, v in t.reward_details.items()},
                        "reward_status": t.reward_status, "finish_reason": t.finish_reason,
                        "response_tokens": len(t.response_ids), "start_version": first, "end_version": last})
    return out


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def write_generations(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """A whole generations.jsonl at once (`asyncrl eval`'s), replacing any earlier one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def table_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The first `TABLE_ROWS` records as (columns, rows) for a text table: sample, reward, its
    parts as `name=value`, versions, prompt and response cut to `CELL_CHARS`."""
    columns = ["sample", "reward", "reward_parts", "versions", "prompt", "response"]
    body = [[r["sample"], r["reward"], " ".join(f"{k}={v:.3g}" if v is not None else f"{k}=null"
                                                 for k, v in r["reward_parts"].items()),
             f"{r['start_version']}-{r['end_version']}", _cut(r["prompt"]), _cut(r["response"])]
            for r in rows[:TABLE_ROWS]]
    return columns, body


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`table_rows` as a Markdown table (TensorBoard's text tab renders it), with a line saying
    how many of the records it shows."""
    columns, body = table_rows(rows)
    lines = [f"{len(body)} of {len(rows)} responses", "", "| " + " | ".join(columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in body]
    return "\n".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "…"


def _cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, line breaks as <br>."""
    return str(value).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")
