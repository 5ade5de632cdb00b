"""Padded training tensors, built once on the trainer side from finished groups.

Layout (verl's): prompts left-padded to P, responses right-padded to T, so every response
token sits at the same column and `logits[:, P-1 : P-1+T]` predict the response. Per-token
tensors over the response are (B, T); `response_mask` marks real tokens.
This module does not compute anything RL-specific; it only arranges data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
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

    def select(self, rows: Sequence[int] | torch.Tensor) -> TrainBatch:
        """A sub-batch of the given rows (tensors indexed, lists picked)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
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


def micro_batches(batch: TrainBatch, token_budget: int) -> Iterator[TrainBatch]:
    """Consecutive rows whose padded length x count stays within the token budget."""
    width = batch.input_ids.shape[1]
    per = max(1, token_budget // width)
    for start in range(0, batch.size, per):
        yield batch.select(range(start, min(start + per, batch.size)))
