"""Padded training tensors, built once on the trainer side from finished groups.

Layout (verl's): prompts left-padded to P, responses right-padded to T, so every response
token sits at the same column and `logits[:, P-1 : P-1+T]` predict the response. Per-token
tensors over the response are (B, T); `response_mask` marks real tokens (all attended) and
`loss_mask` the trained ones among them: a multi-turn episode's tool and environment text is
attended context (attention 1, loss 0) with no behaviour log-prob. A batch of single-turn
responses (every `Trajectory.loss_mask` empty) holds one tensor for both masks, so nothing more
is gathered, moved or trimmed for it.
Micro-batches are length-aware: rows sorted by length, grouped to keep padding low, and each
group cut to the columns its own rows use (`plan_micro_batches`, `trim`). When the trainer packs
(`asyncrl.training.packing`), a group costs its rows' real tokens instead of rows x width, and
rows are filled first-fit decreasing into groups within the budget (`fill_micro_batches`).

No plan reads a device tensor: the per-row facts every plan needs (`HostRows`: spans, real
tokens, response-token counts) are read once from the CPU tensors where the batch is built,
before `TrainBatch.to` moves it, and travel with it. A planned batch is reordered once (one
gather), so its micro-batches are slices (views) and no index is copied to the device per
micro-batch; results are put back in row order with one index at the end (`fill_rows`).
Metrics stay device tensors until `to_host` brings a step's worth over in one transfer.
This module does not compute anything RL-specific; it only arranges data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F

from asyncrl.types import Group

Metrics = dict[str, torch.Tensor | float]
"""Step metrics before `to_host`: 0-dim device tensors (float64 sums) and plain floats."""


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`; a CPU tensor goes to a GPU from pinned memory, asynchronously, so the copy
    waits for nothing on the host (what the CUDA stream already runs is undisturbed)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_host(metrics: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """The metrics as floats, every tensor among them read in one transfer (a host sync)."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if keys:
        values = torch.stack([metrics[k].detach().double() for k in keys]).tolist()  # type: ignore[union-attr]
        out |= dict(zip(keys, values, strict=True))
    return {k: out[k] for k in metrics}


@dataclass(frozen=True)
class HostRows:
    """Per-row facts (Python numbers) that micro-batch and packing plans need, read from the
    batch's tensors once, on the CPU where it is built, so that planning reads no device tensor."""

    prompt_B: tuple[int, ...]  # columns each row needs left of P (`row_spans`)
    response_B: tuple[int, ...]  # columns each row needs from P on (`row_spans`)
    prompt_real_B: tuple[int, ...]  # attended prompt tokens
    response_real_B: tuple[int, ...]  # attended response tokens
    tokens_B: tuple[float, ...]  # loss_mask summed over the row: the trained (model) tokens
    contiguous_B: tuple[bool, ...]  # attended tokens are columns [P - prompt_real, P + response_real), and a
    # response token has one before it: what `packing.pack` needs

    @staticmethod
    def read(batch: TrainBatch) -> HostRows:
        """`batch`'s facts, in one read of its tensors (a host sync only for a batch that is on a
        device already without them)."""
        P = batch.prompt_width
        keep = batch.attention_mask != 0  # (B, P+T)
        prompt_real, response_real = keep[:, :P].sum(-1), keep[:, P:].sum(-1)
        cols = torch.arange(keep.shape[1], device=keep.device)
        run = (cols >= P - prompt_real[:, None]) & (cols < P + response_real[:, None])  # (B, P+T)
        contiguous = (run == keep).all(-1) & ((prompt_real > 0) | (response_real == 0))
        columns = [*row_spans(batch), prompt_real, response_real, batch.loss_mask.sum(-1), contiguous]
        facts = torch.stack([c.double() for c in columns]).tolist()  # (6, B)
        spans_p, spans_r, real_p, real_r = (tuple(int(x) for x in row) for row in facts[:4])
        return HostRows(spans_p, spans_r, real_p, real_r, tuple(facts[4]), tuple(bool(x) for x in facts[5]))

    def take(self, rows: Sequence[int] | slice) -> HostRows:
        """The facts of `rows` (a list of rows, or a slice)."""
        def pick(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return values[rows] if isinstance(rows, slice) else tuple(values[r] for r in rows)

        return HostRows(*(pick(getattr(self, f.name)) for f in fields(self)))

    def tokens(self) -> float:
        """Trained response tokens of the rows (`agg_loss`'s global token count)."""
        return float(sum(self.tokens_B))

    def sequences(self) -> float:
        """Rows with at least one trained token (`agg_loss`'s global sequence count)."""
        return float(sum(1 for t in self.tokens_B if t > 0))


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # (B, P+T)
    attention_mask: torch.Tensor  # (B, P+T)
    position_ids: torch.Tensor  # (B, P+T)
    responses: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) float: real response tokens, all attended
    loss_mask: torch.Tensor  # (B, T) float: the trained ones; `response_mask` itself when that is all of them
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
    host: HostRows | None = None  # the rows' plan facts, set by `to` (read from the CPU batch)

    @property
    def size(self) -> int:
        return int(self.responses.shape[0])

    @property
    def has_context_tokens(self) -> bool:
        """Whether some attended response tokens are not trained (a multi-turn episode's tool text)."""
        return self.loss_mask is not self.response_mask

    def to(self, device: torch.device) -> TrainBatch:
        """The batch on `device` (itself when it is there already: its plans read its tensors
        there), its `host` facts read first, on the CPU batch the pipeline built: a trainer on
        another device moves each batch it is handed, and plans from them."""
        if self.responses.device == device:
            return self
        planned = self if self.host is not None else replace(self, host=HostRows.read(self))
        move = _once(lambda t: to_device(t, device))
        out: dict[str, Any] = {f.name: move(getattr(self, f.name)) for f in fields(self)
                               if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(planned, extras={k: to_device(v, device) for k, v in self.extras.items()}, **out)

    def select(self, rows: Sequence[int]) -> TrainBatch:
        """A sub-batch of the given rows (tensors gathered with one index copied to their device,
        lists picked)."""
        idx = to_device(torch.tensor(list(rows), dtype=torch.long), self.responses.device)
        return self._rows(lambda v: v.index_select(0, idx), list(rows))

    def sliced(self, rows: slice) -> TrainBatch:
        """A sub-batch of the rows `rows` picks (`slice(start, stop, step)`): views, no index."""
        return self._rows(lambda v: v[rows], rows)

    def _rows(self, take: Callable[[torch.Tensor], torch.Tensor], rows: Sequence[int] | slice) -> TrainBatch:
        take = _once(take)
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = take(value)
            elif f.name == "index":
                out[f.name] = value[rows] if isinstance(rows, slice) else [value[i] for i in rows]
            elif f.name == "extras":
                out[f.name] = {k: take(v) for k, v in value.items()}
            elif f.name == "host":
                out[f.name] = None if value is None else value.take(rows)
        return replace(self, **out)


def build_batch(groups: Sequence[Group], pad_id: int) -> TrainBatch:
    """Flatten groups into one padded batch, one row per trajectory. The reward sits on the last
    trained token (the last response token unless an episode ends on tool text); `loss_mask` is
    `response_mask` itself unless some trajectory carries a `loss_mask`.
    Example: response [a, b, t, t, c, t] with loss mask [1, 1, 0, 0, 1, 0] -> every column
    attended, loss mask as given, reward on column 4 (c).
    An agent episode's other chains (`Trajectory.chains`) are rows of their own, just before
    the episode's row, each with the episode's reward (`episode_rows`)."""
    trajs = [(g.uid, row) for g in groups for t in g.trajectories for row in (*t.chains, t)]
    rewards = [t.reward for g in groups for t in g.trajectories for _ in (*t.chains, t)]
    assert trajs, "cannot build an empty batch"
    P = max(len(t.prompt_ids) for _, t in trajs)
    T = max(max(len(t.response_ids) for _, t in trajs), 1)
    B = len(trajs)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + T), dtype=torch.long)
    rollout_lp = torch.zeros((B, T))
    versions = torch.zeros((B, T), dtype=torch.long)
    scores = torch.zeros((B, T))
    loss_mask = torch.zeros((B, T)) if any(len(t.loss_mask) for _, t in trajs) else None
    for i, ((_, t), reward) in enumerate(zip(trajs, rewards, strict=True)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, P - p : P] = torch.tensor(t.prompt_ids)
        input_ids[i, P : P + r] = torch.tensor(t.response_ids, dtype=torch.long)
        attention_mask[i, P - p : P + r] = 1
        rollout_lp[i, :r] = torch.tensor(t.logprobs)
        versions[i, :r] = torch.tensor(t.versions, dtype=torch.long)
        if loss_mask is not None:
            assert len(t.loss_mask) in (0, r), f"{t.request_id}: {len(t.loss_mask)} loss-mask entries for {r} tokens"
            loss_mask[i, :r] = torch.tensor(t.loss_mask, dtype=torch.float) if len(t.loss_mask) else 1.0
        if r:
            scores[i, _last_trained(t.loss_mask, r)] = reward
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    response_mask = attention_mask[:, P:].float()
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        responses=input_ids[:, P:], response_mask=response_mask,
        loss_mask=response_mask if loss_mask is None else loss_mask,
        rollout_log_probs=rollout_lp, token_level_scores=scores, versions=versions,
        index=[uid for uid, _ in trajs], prompt_width=P)


def episode_rows(groups: Sequence[Group]) -> list[int]:
    """For each row of `build_batch(groups)`, the row of its episode: itself for every response,
    the episode's own row (its last chain's) for an agent episode's other chains.
    Example: trajectories a, b where b has one other chain c -> rows [a, c, b] -> [0, 2, 2]."""
    out: list[int] = []
    for t in (t for g in groups for t in g.trajectories):
        out += [len(out) + len(t.chains)] * (len(t.chains) + 1)
    return out


def _last_trained(loss_mask: Sequence[int], length: int) -> int:
    """The column of a response's last trained token (its last token when none or all are)."""
    return next((i for i in range(len(loss_mask) - 1, -1, -1) if loss_mask[i]), length - 1)


def _once(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """`fn`, run once per distinct tensor: a tensor held under two names (a single-turn batch's
    `loss_mask` is its `response_mask`) comes out as one, and is gathered, moved or cut once."""
    done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def run(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in done:
            done[id(t)] = (t, fn(t))  # holding `t` keeps its id from being reused meanwhile
        return done[id(t)][1]
    return run


def split_rows(n_rows: int, n_parts: int) -> list[list[int]]:
    """Consecutive row ranges of near-equal size (mini-batches keep whole groups together)."""
    bounds = [round(i * n_rows / n_parts) for i in range(n_parts + 1)]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]


def mean_over_mini_batches(batch: TrainBatch, epochs: int, num_mini_batches: int,
                           step: Callable[[TrainBatch], Metrics]) -> Metrics:
    """Run `step` on every mini-batch (consecutive rows, a slice) of every epoch; the metrics
    averaged over those calls, tensors staying tensors."""
    sums: Metrics = defaultdict(float)
    n = 0
    for _ in range(epochs):
        for rows in split_rows(batch.size, num_mini_batches):
            for k, v in step(batch.sliced(slice(rows[0], rows[-1] + 1))).items():
                sums[k] = sums[k] + v
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
    cut = _once(lambda v: v[:, :response_len])
    out: dict[str, Any] = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if f.name in _FULL_WIDTH:
            out[f.name] = value[:, P - prompt_len : P + response_len]
        elif isinstance(value, torch.Tensor):
            out[f.name] = cut(value)
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


def host_rows(batch: TrainBatch) -> HostRows:
    """`batch.host`, or read from its tensors (free on the CPU) for a batch not moved by `to`."""
    return batch.host if batch.host is not None else HostRows.read(batch)


def micro_batches(batch: TrainBatch, token_budget: int,
                  packed: bool = False) -> Iterator[tuple[list[int], TrainBatch]]:
    """(rows, micro-batch) pairs: rows as `plan_micro_batches` groups them (`packed`: by real
    tokens), each micro-batch trimmed to the columns its rows need. Planned from `host_rows`; the
    batch is reordered once, group after group, so each micro-batch is a slice of it. Rows come
    out reordered; see `map_micro_batches`."""
    host = host_rows(batch)
    groups = plan_micro_batches(host.prompt_B, host.response_B, token_budget, packed=packed)
    ordered = replace(batch, host=host).select([r for rows in groups for r in rows])
    start = 0
    for rows in groups:
        mb = ordered.sliced(slice(start, start + len(rows)))
        start += len(rows)
        yield rows, trim(mb, max(host.prompt_B[r] for r in rows), max(host.response_B[r] for r in rows))


def map_micro_batches(batch: TrainBatch, token_budget: int, fn: Callable[[TrainBatch], torch.Tensor],
                      packed: bool = False) -> torch.Tensor:
    """`fn`'s (rows, width) result on each micro-batch (planned as `micro_batches` plans them),
    back in the batch's row order and padded with zeros to the batch's response width T. # (B, T)"""
    return fill_rows(batch, micro_batches(batch, token_budget, packed), fn)


def fill_rows(batch: TrainBatch, parts: Iterable[tuple[list[int], TrainBatch]],
              fn: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
    """`fn` run on every part; each result written at its `rows` of a zero (B, T) tensor (a part
    with no rows is run and dropped), all parts at once after the last, with one index."""
    T = batch.responses.shape[1]
    results, rows_all, last = [], [], None
    for rows, mb in parts:
        last = fn(mb)
        if rows:
            results.append(F.pad(last, (0, T - last.shape[1])))  # (rows, T)
            rows_all += rows
    assert last is not None, "an empty batch has no micro-batches"
    out = last.new_zeros((batch.size, T))
    if not rows_all:
        return out
    return out.index_copy(0, to_device(torch.tensor(rows_all), out.device), torch.cat(results))
