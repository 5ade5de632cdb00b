"""Padded training tensors, built once on the trainer side from finished groups.

Layout (verl's): prompts left-padded to P, responses right-padded to T, so every response
token sits at the same column and `logits[:, P-1 : P-1+T]` predict the response. Per-token
tensors over the response are (B, T); `response_mask` marks real tokens.
Micro-batches are length-aware: rows sorted by length, grouped to keep padding low, and each
group cut to the columns its own rows use (`plan_micro_batches`, `trim`). When the trainer packs
(`asyncrl.training.packing`), a group costs its rows' real tokens instead of rows x width, and
rows are filled first-fit decreasing into groups within the budget (`fill_micro_batches`).
This module does not compute anything RL-specific; it only arranges data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from asyncrl.types import Group


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # (B, P+T)
    attention_mask: torch.Tensor  # (B, P+T)
    position_ids: torch.Tensor  # (B, P+T)
    responses: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) float
    rollout_log_probs: torch.Tensor  # (B, T) behaviour policy, from the engine
    token_level_scores: torch.Tensor  # (B, T) reward on the last response token
    versions: torch.Tensor  # (B, T) policy version that produced each token
    index: list[str]  # (B,) group uid of each row
    prompt_width: int
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.responses.shape[0])

    def to(self, device: torch.device) -> TrainBatch:
        """The batch on `device` (itself when it is there already): the pipeline builds batches on
        the CPU, a trainer on another device moves each batch it is handed."""
        if self.responses.device == device:
            return self
        out: dict[str, Any] = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                               if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, extras={k: v.to(device) for k, v in self.extras.items()}, **out)

    def select(self, rows: Sequence[int] | torch.Tensor) -> TrainBatch:
        """A sub-batch of the given rows (tensors indexed, lists picked)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.responses.device)
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value[idx]
            elif f.name == "index":
                out[f.name] = [value[i] for i in idx.tolist()]
            elif f.name == "extras":
                out[f.name] = {k: v[idx] for k, v in value.items()}
            else:
                out[f.name] = value
        return replace(self, **out)


def build_batch(groups: Sequence[Group], pad_id: int) -> TrainBatch:
    """Flatten groups into one padded batch, one row per trajectory."""
    trajs = [(g.uid, t) for g in groups for t in g.trajectories]
    assert trajs, "cannot build an empty batch"
    P = max(len(t.prompt_ids) for _, t in trajs)
    T = max(max(len(t.response_ids) for _, t in trajs), 1)
    B = len(trajs)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + T), dtype=torch.long)
    rollout_lp = torch.zeros((B, T))
    versions = torch.zeros((B, T), dtype=torch.long)
    scores = torch.zeros((B, T))
    for i, (_, t) in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, P - p : P] = torch.tensor(t.prompt_ids)
        input_ids[i, P : P + r] = torch.tensor(t.response_ids, dtype=torch.long)
        attention_mask[i, P - p : P + r] = 1
        rollout_lp[i, :r] = torch.tensor(t.logprobs)
        versions[i, :r] = torch.tensor(t.versions, dtype=torch.long)
        if r:
            scores[i, r - 1] = t.reward
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        responses=input_ids[:, P:], response_mask=attention_mask[:, P:].float(),
        rollout_log_probs=rollout_lp, token_level_scores=scores, versions=versions,
        index=[uid for uid, _ in trajs], prompt_width=P)


def split_rows(n_rows: int, n_parts: int) -> list[list[int]]:
    """Consecutive row ranges of near-equal size (mini-batches keep whole groups together)."""
    bounds = [round(i * n_rows / n_parts) for i in range(n_parts + 1)]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]


def mean_over_mini_batches(batch: TrainBatch, epochs: int, num_mini_batches: int,
                           step: Callable[[TrainBatch], dict[str, float]]) -> dict[str, float]:
    """Run `step` on every mini-batch of every epoch; the metrics averaged over those calls."""
    sums: dict[str, float] = defaultdict(float)
    n = 0
    for _ in range(epochs):
        for rows in split_rows(batch.size, num_mini_batches):
            for k, v in step(batch.select(rows)).items():
                sums[k] += v
            n += 1
    return {k: v / max(n, 1) for k, v in sums.items()}


_FULL_WIDTH = ("input_ids", "attention_mask", "position_ids")  # (B, P+T); the rest are (B, T)


def row_spans(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns each row needs, (prompt_B, response_B): from its first attended prompt column to
    column P, and up to its last attended or masked-in response column (each at least 1).

    Example: P = 3, T = 4, attention row [0, 1, 1 | 1, 1, 0, 0] -> prompt 2, response 2."""
    P, T = batch.prompt_width, batch.responses.shape[1]
    prompt_used = batch.attention_mask[:, :P] != 0  # (B, P)
    response_used = (batch.attention_mask[:, P:] != 0) | (batch.response_mask != 0)  # (B, T)
    device = batch.attention_mask.device
    prompt_B = (prompt_used * torch.arange(P, 0, -1, device=device)).amax(-1)  # P - first used column
    response_B = (response_used * torch.arange(1, T + 1, device=device)).amax(-1)  # last used column + 1
    return prompt_B.clamp_min(1), response_B.clamp_min(1)


def trim(batch: TrainBatch, prompt_len: int, response_len: int) -> TrainBatch:
    """The batch cut to its last `prompt_len` prompt and first `response_len` response columns
    (views; response-aligned tensors, extras included, cut to the same response width)."""
    P = batch.prompt_width
    out: dict[str, Any] = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if f.name in _FULL_WIDTH:
            out[f.name] = value[:, P - prompt_len : P + response_len]
        elif isinstance(value, torch.Tensor):
            out[f.name] = value[:, :response_len]
        elif f.name == "extras":
            out[f.name] = {k: v[:, :response_len] for k, v in value.items()}
    return replace(batch, prompt_width=prompt_len, **out)


# Fixed cost of one micro-batch, in padded tokens: the tiny model's actor forward+backward
# (`Actor._micro_batch_loss` + `backward`, 2 threads on the 2-core dev CPU) timed at 4..256 rows x
# widths 20..80, medians of 8, fitted as time = a x tokens + b: a = 45-49 us/token, b = 6-9 ms,
# so b / a = 127-192 tokens over two runs.
MICRO_BATCH_OVERHEAD_TOKENS = 160


def plan_micro_batches(prompt_B: Sequence[int], response_B: Sequence[int], token_budget: int,
                       overhead: int = MICRO_BATCH_OVERHEAD_TOKENS, packed: bool = False) -> list[list[int]]:
    """Row groups, each to be one micro-batch: padded to its own widths (longest prompt +
    longest response among its rows), or with `packed` its rows' real tokens back to back
    (`asyncrl.training.packing`, see `fill_micro_batches`).

    Padded split rule: sort rows by real length (prompt + response), then cut the sorted list
    into consecutive runs minimising sum(rows x own width) + `overhead` per run, each run within
    `token_budget` padded tokens (a single row over it runs alone). A DP over cut points.
    Example: lengths 20, 20, 20, 100 (prompt 16), budget 1000, overhead 50: together 4 x 100 +
    50 = 450; split [3 x 20 + 50] + [100 + 50] = 260, so two micro-batches."""
    if packed:
        return fill_micro_batches([p + r for p, r in zip(prompt_B, response_B, strict=True)], token_budget)
    n = len(prompt_B)
    order = sorted(range(n), key=lambda i: (prompt_B[i] + response_B[i], response_B[i]))
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        prompt = response = 0
        for i in range(j - 1, -1, -1):  # the last run is order[i:j]
            prompt, response = max(prompt, prompt_B[order[i]]), max(response, response_B[order[i]])
            tokens = (j - i) * (prompt + response)
            if tokens > token_budget and i < j - 1:
                break  # widening the run only adds tokens
            if best[i] + tokens + overhead < best[j]:
                best[j], cut[j] = best[i] + tokens + overhead, i
    runs, j = [], n
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def fill_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Rows grouped so each group's total length fits `token_budget` (a row over it runs alone),
    in few groups: first-fit decreasing, the longest row first, each into the first group with
    room for it. A packed micro-batch costs its real tokens, so fewer, fuller groups cost less.
    Example: lengths 60, 50, 40, 30, 20, budget 100 -> [[0, 2], [1, 3, 4]] (100 and 100)."""
    groups: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = next((k for k, free in enumerate(room) if lengths[row] <= free), len(groups))
        if k == len(groups):
            groups.append([])
            room.append(token_budget)
        groups[k].append(row)
        room[k] -= lengths[row]
    return groups


def micro_batches(batch: TrainBatch, token_budget: int,
                  packed: bool = False) -> Iterator[tuple[list[int], TrainBatch]]:
    """(rows, micro-batch) pairs: rows as `plan_micro_batches` groups them (`packed`: by real
    tokens), each micro-batch trimmed to the columns its rows need. Rows come out reordered;
    see `map_micro_batches`."""
    prompt_B, response_B = (x.tolist() for x in row_spans(batch))
    for rows in plan_micro_batches(prompt_B, response_B, token_budget, packed=packed):
        mb = batch.select(rows)
        yield rows, trim(mb, max(prompt_B[r] for r in rows), max(response_B[r] for r in rows))


def map_micro_batches(batch: TrainBatch, token_budget: int, fn: Callable[[TrainBatch], torch.Tensor],
                      packed: bool = False) -> torch.Tensor:
    """`fn`'s (rows, width) result on each micro-batch (planned as `micro_batches` plans them),
    back in the batch's row order and padded with zeros to the batch's response width T. # (B, T)"""
    return fill_rows(batch, micro_batches(batch, token_budget, packed), fn)


def fill_rows(batch: TrainBatch, parts: Iterable[tuple[list[int], TrainBatch]],
              fn: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
    """`fn` run on every part; each result written at its `rows` of a zero (B, T) tensor (a part
    with no rows is run and dropped)."""
    out: torch.Tensor | None = None
    for rows, mb in parts:
        part = fn(mb)
        if out is None:
            out = part.new_zeros((batch.size, batch.responses.shape[1]))
        if rows:
            out[rows, : part.shape[1]] = part
    assert out is not None, "an empty batch has no micro-batches"
    return out
