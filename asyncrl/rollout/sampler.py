"""Token sampling for a batch of rows with per-row temperature, top-k, top-p and seeds.

Sampling is inverse-CDF (softmax → cumsum → searchsorted on one uniform draw per row), not
`torch.multinomial`, which draws an exponential per vocabulary entry and cost ~6× more than the
model forward at a 49K vocabulary on the project machine (research/cpu_measurements.md §3).

The returned log-prob of a token is `log_softmax(logits / T)[token]` over the FULL vocabulary,
before top-k/top-p filtering: that is what a trainer recomputes with the same temperature, so
behaviour and recomputed log-probs agree. For greedy rows (T = 0) it uses T = 1.

Seeds: a row with its own `random.Random` draws its uniform from it, so its samples do not
depend on what else is in the batch (cost: one Python `random()` call per seeded row per step,
~0.1 µs, plus one small tensor per step; a per-row `torch.rand(generator=...)` cost ~50× more).
Rows without one share a single batched draw from the engine's `torch.Generator`.

On a GPU nothing here waits for the device: what needs a branch (all rows at T = 1, the widest
top-k) is decided on the host from the request settings in `SamplingBatch.build`, and the
settings and the uniforms go to the device by pinned, non-blocking copies
(`asyncrl.rollout.transfer`). The caller's one device-to-host copy of the results is the step's
only synchronisation.

This module knows nothing about requests, stop tokens or the KV cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from asyncrl.rollout.transfer import to_device
from asyncrl.types import SamplingParams


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per step."""

    temperatures: torch.Tensor  # (B,) float32, 0 → greedy
    top_k: torch.Tensor  # (B,) int64, <= 0 → off
    top_p: torch.Tensor  # (B,) float32, 1 → off
    generators: tuple[random.Random | None, ...]  # per-row RNG for seeded rows
    all_greedy: bool
    any_greedy: bool
    any_filter: bool
    any_top_p: bool
    unit_temperature: bool
    """Every row samples at T = 1 (greedy rows count as 1): the logits need no division."""
    widest_top_k: int
    """The largest top-k of any row, 0 when a row keeps the whole vocabulary (top_k <= 0)."""

    @staticmethod
    def build(
        params: list[SamplingParams],
        generators: list[random.Random | None],
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        temps = [max(float(p.temperature), 0.0) for p in params]
        top_k = [int(p.top_k) for p in params]
        top_p = [float(p.top_p) for p in params]
        sampled = [t > 0 for t in temps]
        uses_k = [s and k > 0 for s, k in zip(sampled, top_k)]
        uses_p = [s and p < 1.0 for s, p in zip(sampled, top_p)]
        # One copy to the device; top-k travels as float32, exact below 2**24.
        settings = to_device(torch.tensor([temps, top_k, top_p], dtype=torch.float32), torch.device(device))
        return SamplingBatch(
            temperatures=settings[0],
            top_k=settings[1].to(torch.int64),
            top_p=settings[2],
            generators=tuple(generators),
            all_greedy=not any(sampled),
            any_greedy=not all(sampled),
            any_filter=any(uses_k) or any(uses_p),
            any_top_p=any(uses_p),
            unit_temperature=all(t in (0.0, 1.0) for t in temps),
            widest_top_k=max(top_k, default=0) if all(k > 0 for k in top_k) else 0,
        )


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of non-negative `weights` (n, C); uniforms (n,) in (0, 1].

    The target is strictly positive, so a zero-weight first entry can never be picked; other
    zero-weight entries never are either, since searchsorted returns the first index whose
    cumulative weight reaches the target.
    """
    cdf = weights.cumsum(-1)  # (n, C)
    target = uniforms[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(1).clamp_max(weights.shape[-1] - 1)


def draw_uniforms(batch: SamplingBatch, default: torch.Generator | None) -> torch.Tensor:
    """One draw in (0, 1] per row: the row's own RNG where given, one batched draw otherwise.

    (0, 1] rather than [0, 1): `1 - u` is taken in float64 before the cast, since a float64
    draw just below 1 would round to 1.0 in float32 and a draw of 0 could pick a zero-weight
    first token. Drawn on the CPU and moved to the logits' device without waiting for it.
    """
    u = 1.0 - torch.rand(len(batch.generators), generator=default, dtype=torch.float64)
    seeded = [(row, 1.0 - gen.random()) for row, gen in enumerate(batch.generators) if gen is not None]
    if seeded:
        rows, values = zip(*seeded)
        u[list(rows)] = torch.tensor(values, dtype=torch.float64)
    return to_device(u.to(torch.float32), batch.temperatures.device)


def _filtered_sample(
    probs: torch.Tensor, batch: SamplingBatch, uniforms: torch.Tensor
) -> torch.Tensor:
    """Sample under top-k/top-p for all rows (rows with neither keep everything).

    Works in descending-probability order: top-k keeps the first k, top-p keeps the smallest
    prefix whose (top-k renormalised) mass reaches p, as HF's and vLLM's warpers do.
    """
    vocab = probs.shape[-1]
    k = torch.where(batch.top_k > 0, batch.top_k.clamp_max(vocab), vocab)  # (B,)
    if batch.any_top_p:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
    else:  # = k.max(), known on the host
        sorted_probs, order = probs.topk(min(batch.widest_top_k or vocab, vocab), dim=-1)
    rank = torch.arange(sorted_probs.shape[-1], device=probs.device)[None]
    keep = rank < k[:, None]
    sorted_probs = sorted_probs * keep
    if batch.any_top_p:
        mass = sorted_probs / sorted_probs.sum(-1, keepdim=True)
        mass_before = mass.cumsum(-1) - mass
        keep_p = (mass_before < batch.top_p[:, None]) | (batch.top_p[:, None] >= 1.0)
        sorted_probs = sorted_probs * keep_p
    picked = inverse_cdf(sorted_probs, uniforms)
    return order.gather(-1, picked[:, None]).squeeze(1)


def sample(
    logits: torch.Tensor, batch: SamplingBatch, default: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. logits: (B, V) float32. Returns (tokens (B,), logprobs (B,))."""
    greedy_tokens = logits.argmax(-1) if batch.any_greedy else None
    temps = torch.where(batch.temperatures > 0, batch.temperatures, 1.0)
    scaled = logits if batch.unit_temperature else logits / temps[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
    if batch.all_greedy:
        assert greedy_tokens is not None  # all_greedy implies any_greedy (non-empty batch)
        tokens = greedy_tokens
    else:
        probs = logprobs.exp()
        uniforms = draw_uniforms(batch, default)
        if batch.any_filter:
            tokens = _filtered_sample(probs, batch, uniforms)
        else:
            tokens = inverse_cdf(probs, uniforms)
        if greedy_tokens is not None:
            tokens = torch.where(batch.temperatures > 0, tokens, greedy_tokens)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(1)
