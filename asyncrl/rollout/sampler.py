"""Token sampling on the device, per row: temperature, top-k, top-p, counter-based seeds.

`DeviceSampler` holds the rows' sampling settings and the sampled tokens in static device
buffers (a CUDA graph's inputs and outputs): `tokens[slot]` is the last token sampled for the row
in that slot, which the next decode step reads as its input without a trip through the host.
`sample_rows` samples some rows' logits into those buffers; it runs inside the decode graph.

Sampling is inverse-CDF (softmax → cumsum → searchsorted on one uniform per row), not
`torch.multinomial`, which draws an exponential per vocabulary entry and cost ~6× more than the
model forward at a 49K vocabulary on the project machine (research/cpu_measurements.md §3).

The returned log-prob of a token is `log_softmax(logits / T)[token]` over the FULL vocabulary,
before top-k/top-p filtering: that is what a trainer recomputes with the same temperature, so
behaviour and recomputed log-probs agree. For greedy rows (T = 0) it uses T = 1.

Randomness is counter-based: the uniform of a row is a hash of (the request's 32-bit key, the
position of the row's last input token), computed with int64 tensor ops on the device
(`uniforms`), so a request's tokens depend on neither the other rows of its batch nor the step
it runs in: the same seeded request samples the same tokens alone, in any batch, after a
preemption and after abort + continue. A seeded request's key is `request_key(seed)`; the engine
draws an unseeded request's key from its own seed stream. The hash is Wellons' `lowbias32`
finaliser (two multiply-xorshift rounds, both multipliers below 2**31 so every product fits an
int64) over `(position * 0x9E3779B9) XOR key`: XOR rather than a sum, so that two keys never give
streams that are shifted copies of each other.

What depends on the rows' settings as a whole (all greedy? all at T = 1? top-p anywhere? the
widest top-k) is a `SamplingMode` decided on the host from the request settings, part of a
decode graph's key, so nothing here reads a tensor on the host. The mode changes how much is
computed, never a row's token: a row without top-k/top-p draws in vocabulary order whatever the
other rows use (ties in probability aside, a top-k row keeps the same tokens in the same order
through `topk` and through a full sort).

This module knows nothing about requests, stop tokens, the KV cache or when results are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncrl.rollout.kv_cache import compose_moves
from asyncrl.rollout.sizes import pow2_at_least
from asyncrl.rollout.transfer import copy_from_host, to_device
from asyncrl.types import SamplingParams

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive positions over the 32-bit range
LOWBIAS32 = (0x21F0AAAD, 0x735A2D97)  # Wellons' hash-prospector constants, both < 2**31


def mix32(x: int | torch.Tensor) -> int | torch.Tensor:
    """Wellons' `lowbias32` of 32-bit values: a Python int, or an int64 tensor of values in
    [0, 2**32). Each product is below 2**63, so int64 never overflows and both give the same bits.

    Example: mix32(1): 1 -> 1 -> 0x21F0AAAD -> 0x21F0E94C -> 0x86D3F7D4 -> 0x86D2FA73."""
    x = x ^ (x >> 16)
    x = (x * LOWBIAS32[0]) & M32
    x = x ^ (x >> 15)
    x = (x * LOWBIAS32[1]) & M32
    return x ^ (x >> 15)


def request_key(seed: int) -> int:
    """The 32-bit sampling key of a request seed (any int; taken modulo 2**64)."""
    seed &= 2**64 - 1
    return int(mix32((int(mix32(seed & M32)) + ((seed >> 32) + 1) * GOLDEN) & M32))


def uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One float32 in (0, 1] per row from int64 `keys` (< 2**32) and `positions` (< 2**31).

    1 - (the top 24 bits of the hash) * 2**-24: exact in float32, never 0, so inverse CDF can
    never pick a zero-weight first token."""
    x = mix32(((positions * GOLDEN) ^ keys) & M32)
    assert isinstance(x, torch.Tensor)
    return torch.rsub(x >> 8, 1.0, alpha=2.0**-24)  # 1 - alpha * x; int64 with a float: float32


def uniform_of(key: int, position: int) -> float:
    """`uniforms` of one row in Python ints: the reference the tests compare against."""
    return 1.0 - (int(mix32(((position * GOLDEN) ^ key) & M32)) >> 8) * 2.0**-24


@dataclass(frozen=True)
class SamplingMode:
    """What a step's sampling computes, decided on the host from its rows' settings."""

    all_greedy: bool
    any_greedy: bool
    unit_temperature: bool
    """Every row samples at T = 1 (greedy rows count as 1): the logits need no division."""
    filtered: bool
    """Some sampled row uses top-k or top-p."""
    unfiltered: bool
    """Some sampled row uses neither: it draws over the vocabulary in its own order, as in a
    step without filters (drawing in sorted order would make its token depend on the others)."""
    top_p: bool
    """Some sampled row uses top-p: a full sort of the vocabulary."""
    top_k_width: int
    """Without top-p: the widest top-k rounded up to a power of two (one graph serves k = 33..64),
    0 when a row keeps the whole vocabulary."""

    @staticmethod
    def of(params: Sequence[SamplingParams]) -> SamplingMode:
        sampled = [p for p in params if p.temperature > 0]
        top_ks = [p.top_k for p in params]
        widest = max(top_ks, default=0) if all(k > 0 for k in top_ks) else 0
        return SamplingMode(
            all_greedy=not sampled,
            any_greedy=len(sampled) < len(params),
            unit_temperature=all(p.temperature in (0.0, 1.0) for p in params),
            filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in sampled),
            unfiltered=any(p.top_k <= 0 and p.top_p >= 1.0 for p in sampled),
            top_p=any(p.top_p < 1.0 for p in sampled),
            top_k_width=pow2_at_least(widest) if widest > 0 else 0,
        )


class DeviceSampler:
    """Static device buffers of each slot's settings and last sampled token, and sampling into them."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.device = device
        self.tokens = torch.zeros(max_rows, dtype=torch.int64, device=device)
        """The last token sampled in each slot: the next decode step's input."""
        self.logprobs = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self._positions = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self._ints = torch.zeros(2, max_rows, dtype=torch.int64, device=device)  # key | top-k
        self._floats = torch.zeros(2, max_rows, dtype=torch.float32, device=device)  # temperature | top-p

    def set_rows(self, keys: Sequence[int], params: Sequence[SamplingParams]) -> SamplingMode:
        """Settings of rows 0..n-1 (a step whose rows are those of the last one keeps them):
        one host-to-device copy per dtype, no wait."""
        n = len(params)
        ints = torch.tensor([list(keys), [p.top_k for p in params]], dtype=torch.int64)
        floats = torch.tensor([[max(p.temperature, 0.0) for p in params], [p.top_p for p in params]])
        copy_from_host(self._ints[:, :n], ints)
        copy_from_host(self._floats[:, :n], floats)
        return SamplingMode.of(params)

    def set_positions(self, positions: Sequence[int]) -> None:
        """Each row's position of its last input token this step: the hash's counter."""
        copy_from_host(self._positions[: len(positions)], torch.tensor(positions, dtype=torch.int64))

    def positions(self, rows: int) -> torch.Tensor:
        """The first `rows` rows' positions as set by `set_positions`, on the device."""
        return self._positions[:rows]

    def sample_rows(self, logits: torch.Tensor, start: int, mode: SamplingMode) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample rows start..start+n-1 from `logits` (n, V) float32 into `tokens` and `logprobs`;
        returns those rows' (tokens, logprobs)."""
        rows = slice(start, start + logits.shape[0])
        keys, top_k = self._ints[:, rows]
        temps, top_p = self._floats[:, rows]
        u = None if mode.all_greedy else uniforms(keys, self._positions[rows])
        tokens, logprobs = sample(logits, temps, top_k, top_p, u, mode)
        self.tokens[rows] = tokens
        self.logprobs[rows] = logprobs
        return tokens, logprobs

    def apply_moves(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """Slot moves (src, dst, length), in order, as the KV cache applies them: one gather."""
        pairs = [(dst, src) for dst, (src, _) in compose_moves(moves).items()]
        if pairs:
            index = to_device(torch.tensor(pairs, dtype=torch.int64).T.contiguous(), self.device)
            self.tokens[index[0]] = self.tokens[index[1]]


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of non-negative `weights` (n, C); uniforms (n,) in (0, 1].

    The target is strictly positive, so a zero-weight first entry can never be picked; other
    zero-weight entries never are either, since searchsorted returns the first index whose
    cumulative weight reaches the target.
    """
    cdf = weights.cumsum(-1)  # (n, C)
    target = uniforms[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(1).clamp_max(weights.shape[-1] - 1)


def _filtered_sample(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor,
                     mode: SamplingMode) -> torch.Tensor:
    """Sample under top-k/top-p for all rows (rows with neither keep everything).

    Works in descending-probability order: top-k keeps the first k, top-p keeps the smallest
    prefix whose (top-k renormalised) mass reaches p, as HF's and vLLM's warpers do.
    """
    vocab = probs.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp_max(vocab), vocab)  # (B,)
    if mode.top_p:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
    else:  # >= k.max(), known on the host
        sorted_probs, order = probs.topk(min(mode.top_k_width or vocab, vocab), dim=-1)
    rank = torch.arange(sorted_probs.shape[-1], device=probs.device)[None]
    sorted_probs = sorted_probs * (rank < k[:, None])
    if mode.top_p:
        mass = sorted_probs / sorted_probs.sum(-1, keepdim=True)
        mass_before = mass.cumsum(-1) - mass
        keep_p = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        sorted_probs = sorted_probs * keep_p
    picked = inverse_cdf(sorted_probs, uniforms)
    return order.gather(-1, picked[:, None]).squeeze(1)


def _draw(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor,
          mode: SamplingMode) -> torch.Tensor:
    """Each row's draw: rows with top-k/top-p in sorted order, rows with neither in vocabulary order."""
    plain = inverse_cdf(probs, uniforms) if mode.unfiltered else None
    if not mode.filtered:
        assert plain is not None, "a sampled row is filtered or not"
        return plain
    filtered = _filtered_sample(probs, top_k, top_p, uniforms, mode)
    return filtered if plain is None else torch.where((top_k > 0) | (top_p < 1.0), filtered, plain)


def sample(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           uniforms: torch.Tensor | None, mode: SamplingMode) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` (B, V) float32, with per-row temperature (0 = greedy),
    top-k (<= 0 off), top-p (1 off) and uniform in (0, 1] (None when every row is greedy).
    Returns (tokens (B,), logprobs (B,))."""
    greedy_tokens = logits.argmax(-1) if mode.any_greedy else None
    if mode.unit_temperature:
        scaled = logits
    else:
        scaled = logits / torch.where(temperatures > 0, temperatures, 1.0)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
    if mode.all_greedy:
        assert greedy_tokens is not None  # all_greedy implies any_greedy (non-empty batch)
        tokens = greedy_tokens
    else:
        assert uniforms is not None, "sampled rows need uniforms"
        tokens = _draw(logprobs.exp(), top_k, top_p, uniforms, mode)
        if greedy_tokens is not None:
            tokens = torch.where(temperatures > 0, tokens, greedy_tokens)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(1)
