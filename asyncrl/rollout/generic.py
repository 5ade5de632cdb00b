"""The generic path: prefill and decode through the HF model's own forward and KV cache, for any
`AutoModelForCausalLM` the fast forward (`asyncrl.rollout.forward`) does not reproduce.

`build_forward` picks the forward for a model. A generic forward runs in one of two modes, chosen
once by a probe forward at start:

- batched: the model's cache is a plain `DynamicCache` (full attention in every layer, 4-D K/V of
  one shape) and its forward takes `position_ids`. K/V live in a `SlotKVCache` like the fast
  path's; a decode step hands HF the running rows' slots `[:B, :L]` as a `DynamicCache`, with an
  attention mask that hides each row's unused tail and explicit position ids, then copies each
  row's new K/V back to its slot. Prefills are right-padded and run as one batch.
- per row: anything else (sliding-window layers, length-dependent rope, other cache types). Each
  slot keeps the cache object HF returned, and every row runs alone: slow, but it is exactly HF's
  own incremental decoding.

Both are slower than the fast path (HF's mask building and cache copies every step). Not here:
scheduling, sampling (the engine's), models whose forward returns no `past_key_values`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from asyncrl.errors import RolloutError
from asyncrl.rollout.attention import DecodeAttentionPath
from asyncrl.rollout.forward import LENGTH_DEPENDENT_ROPE, BatchedForward, fast_path_problem
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.settings import ForwardChoice

logger = logging.getLogger("asyncrl.rollout")


class StepCache(Protocol):
    """What the step runner does with a forward's cache between steps."""

    def reserve(self, num_slots: int, length: int) -> None: ...
    def apply_moves(self, moves: Sequence[tuple[int, int, int]]) -> None: ...
    def release(self) -> None: ...
    @property
    def allocated_tokens(self) -> int: ...


class StepForward(Protocol):
    """Prefill and decode over sequences living in cache slots (see `BatchedForward`)."""

    vocab_size: int

    def new_cache(self, max_slots: int, device: torch.device | str) -> Any: ...
    def decode(self, cache: Any, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...
    def prefill(self, cache: Any, token_ids: torch.Tensor, lengths: torch.Tensor,
                first_slot: int) -> torch.Tensor: ...


def build_forward(model: nn.Module, choice: ForwardChoice = "auto", *,
                  decode_attention: DecodeAttentionPath = "matmul",
                  fused_decode: bool = False) -> tuple[StepForward, str | None]:
    """(forward, why the fast path was not taken or None): the fast forward (decode attention by
    `decode_attention`, the fused decode step when `fused_decode`) when it reproduces `model` exactly, else (or
    when `choice` is "generic": benchmarks, debugging) a `GenericForward`."""
    problem = "forward='generic' was asked for" if choice == "generic" else fast_path_problem(model)
    if problem is None:
        return BatchedForward(model, decode_attention=decode_attention, fused_decode=fused_decode), None
    return GenericForward(model), problem


class SlotCacheObjects:
    """Per-row mode's cache: slot i holds the HF cache object of the sequence in slot i."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.lengths: list[int] = []

    def reserve(self, num_slots: int, length: int) -> None:
        """Slots past `num_slots` belong to no running sequence: drop them, add empty ones."""
        del self.entries[num_slots:], self.lengths[num_slots:]
        grow = num_slots - len(self.entries)
        self.entries += [None] * grow
        self.lengths += [0] * grow

    def apply_moves(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """Compaction, in order; a no-op on slots the cache no longer holds (released while idle)."""
        for src, dst, length in moves:
            assert length >= 0, "no swaps: the per-row cache keeps no prefix cache"
            if src != dst and src < len(self.entries):
                self.entries[dst], self.lengths[dst] = self.entries[src], self.lengths[src]
                self.entries[src], self.lengths[src] = None, 0

    def release(self) -> None:
        self.entries, self.lengths = [], []

    @property
    def allocated_tokens(self) -> int:
        return sum(self.lengths)


class GenericForward:
    """The HF forward with its KV cache, batched where the cache allows it (see module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        config = getattr(model, "config", None)
        assert config is not None, "a Hugging Face model has a config"
        self.vocab_size: int = int(config.get_text_config().vocab_size)
        params = inspect.signature(model.forward).parameters
        self.takes_positions = "position_ids" in params
        self.keeps_logits = "logits_to_keep" in params
        self.kv_shape: tuple[int, int, int, torch.dtype] | None = None  # layers, heads, dim, dtype
        self.per_row_reason = self._probe(config)

    @property
    def batched(self) -> bool:
        return self.per_row_reason is None

    def _probe(self, config: Any) -> str | None:
        """Why rows must run one at a time, or None (and `kv_shape` set) when they can batch."""
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type") in LENGTH_DEPENDENT_ROPE:
            return f"rope_type {rope.get('rope_type')!r} depends on the sequence length"
        if not self.takes_positions:
            return "its forward takes no position_ids"
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self.model(input_ids=torch.ones(1, 2, dtype=torch.int64, device=device), use_cache=True)
        cache = getattr(out, "past_key_values", None)
        if cache is None:
            raise RolloutError(f"{type(self.model).__name__} returns no past_key_values: the "
                               "rollout engine needs a model with a Hugging Face KV cache")
        if type(cache) is not DynamicCache or any(type(x) is not DynamicLayer for x in cache.layers):
            return f"its cache is {type(cache).__name__} with layers " + \
                ", ".join(sorted({type(x).__name__ for x in getattr(cache, "layers", [])}))
        kv = _kv_pairs(cache)
        shapes = {(t.ndim, t.shape[1], t.shape[-1]) for pair in kv for t in pair}
        if len(shapes) != 1 or next(iter(shapes))[0] != 4:
            return f"its key/value shapes (ndim, heads, head_dim) differ: {sorted(shapes)}"
        _, heads, dim = shapes.pop()
        self.kv_shape = (len(kv), heads, dim, kv[0][0].dtype)
        return None

    def new_cache(self, max_slots: int, device: torch.device | str) -> SlotKVCache | SlotCacheObjects:
        if self.kv_shape is None:
            return SlotCacheObjects()
        layers, heads, dim, dtype = self.kv_shape
        return SlotKVCache(layers, heads, dim, max_slots=max_slots, dtype=dtype, device=device)

    # ---- decode ----

    def decode(self, cache: Any, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per row (row i in slot i, at `positions[i]`); logits (B, V) float32."""
        if isinstance(cache, SlotKVCache):
            return self._decode_batched(cache, token_ids, positions)
        rows = [self._run_row(cache, i, token_ids[i : i + 1, None], first=False)
                for i in range(token_ids.shape[0])]
        return torch.cat(rows)

    def _decode_batched(self, cache: SlotKVCache, token_ids: torch.Tensor,
                        positions: torch.Tensor) -> torch.Tensor:
        b, past = token_ids.shape[0], int(positions.max())
        rows = torch.arange(b, device=token_ids.device)
        # HF sees every row with `past` cached positions; a row's slots past its own position are
        # stale, so the mask hides them. The new token is HF's position `past` (the last column).
        hf_cache = DynamicCache(ddp_cache_data=[
            (k[:b, :, :past], v[:b, :, :past])
            for k, v in zip(cache.keys, cache.values)
        ])
        columns = torch.arange(past + 1, device=token_ids.device)[None]
        mask = ((columns < positions[:, None]) | (columns == past)).long()  # (B, past + 1)
        out = self.model(input_ids=token_ids[:, None], attention_mask=mask,
                         position_ids=positions[:, None], past_key_values=hf_cache, use_cache=True)
        for layer, (keys, values) in enumerate(_kv_pairs(out.past_key_values)):
            cache.keys[layer][rows, :, positions] = keys[:, :, -1]
            cache.values[layer][rows, :, positions] = values[:, :, -1]
        return out.logits[:, -1].float()

    # ---- prefill ----

    def prefill(self, cache: Any, token_ids: torch.Tensor, lengths: torch.Tensor,
                first_slot: int, starts: Sequence[int] = ()) -> torch.Tensor:
        """Right-padded contexts from position 0 into slots first_slot..; (n, V) float32 logits
        of each row's last real token. `starts` (batched mode only): row i's slot holds its
        first starts[i] positions already (a prefix-cache hit) and its tokens come after them."""
        if isinstance(cache, SlotKVCache) and any(starts):
            return self._prefill_after(cache, token_ids, lengths, first_slot, starts)
        if isinstance(cache, SlotKVCache):
            return self._prefill_batched(cache, token_ids, lengths, first_slot)
        rows = [self._run_row(cache, first_slot + i, token_ids[i : i + 1, : int(n)], first=True)
                for i, n in enumerate(lengths.tolist())]
        return torch.cat(rows)

    def _prefill_batched(self, cache: SlotKVCache, token_ids: torch.Tensor, lengths: torch.Tensor,
                         first_slot: int) -> torch.Tensor:
        n, t = token_ids.shape
        columns = torch.arange(t, device=token_ids.device)[None]
        # Right padding never changes a real position's output (attention is causal); the mask
        # is for models that derive positions from it. Padded K/V land past each row's length.
        kwargs: dict[str, Any] = {"attention_mask": (columns < lengths[:, None]).long(),
                                  "position_ids": columns.expand(n, t)}
        last = lengths - 1
        keep = torch.unique(last)  # sorted: HF returns logits at these positions only
        if self.keeps_logits:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=token_ids, use_cache=True, **kwargs)
        for layer, (keys, values) in enumerate(_kv_pairs(out.past_key_values)):
            cache.keys[layer][first_slot : first_slot + n, :, :t] = keys
            cache.values[layer][first_slot : first_slot + n, :, :t] = values
        column = torch.searchsorted(keep, last) if self.keeps_logits else last
        return out.logits[torch.arange(n, device=token_ids.device), column].float()

    def _prefill_after(self, cache: SlotKVCache, token_ids: torch.Tensor, lengths: torch.Tensor, first_slot: int,
                       starts: Sequence[int]) -> torch.Tensor:
        """As `_decode_batched` does for one token: HF sees every row with P = max(starts)
        cached positions (a row's columns from its start to P hidden by the mask), the new
        tokens at HF's positions P.. with their own position ids; each real token's K/V is
        then copied to its slot at start + i."""
        n, t = token_ids.shape
        device = token_ids.device
        past = max(starts)
        start = torch.tensor(list(starts), dtype=torch.int64, device=device)[:, None]  # (n, 1)
        hf_cache = DynamicCache(ddp_cache_data=[
            (k[first_slot : first_slot + n, :, :past], v[first_slot : first_slot + n, :, :past])
            for k, v in zip(cache.keys, cache.values)
        ])
        columns = torch.arange(past + t, device=device)[None]
        mask = (columns < start) | ((columns >= past) & (columns < past + lengths[:, None]))  # (n, P + T)
        steps = torch.arange(t, device=device)[None]
        kwargs: dict[str, Any] = {"logits_to_keep": t} if self.keeps_logits else {}
        out = self.model(input_ids=token_ids, attention_mask=mask.long(), position_ids=start + steps,
                         past_key_values=hf_cache, use_cache=True, **kwargs)
        real = steps < lengths[:, None]  # (n, T): real tokens, not padding
        rows, cols = real.nonzero(as_tuple=True)
        slots, positions = first_slot + rows, (start + steps)[rows, cols]
        for layer, (keys, values) in enumerate(_kv_pairs(out.past_key_values)):
            cache.keys[layer][slots, :, positions] = keys[rows, :, past + cols]
            cache.values[layer][slots, :, positions] = values[rows, :, past + cols]
        logits = out.logits[:, -t:]
        return logits[torch.arange(n, device=device), lengths - 1].float()

    # ---- per row ----

    def _run_row(self, cache: SlotCacheObjects, slot: int, ids: torch.Tensor, *, first: bool) -> torch.Tensor:
        """One sequence alone through HF's incremental forward; its cache object stays in `slot`.
        Positions are HF's own (cache length onwards), which is exact when a row is alone."""
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self.keeps_logits else {}
        past = None if first else cache.entries[slot]
        out = self.model(input_ids=ids, past_key_values=past, use_cache=True, **kwargs)
        cache.entries[slot] = out.past_key_values
        cache.lengths[slot] = (0 if first else cache.lengths[slot]) + ids.shape[1]
        return out.logits[:, -1].float()


def _kv_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of each layer of a `DynamicCache` of plain `DynamicLayer`s, (B, H, L, D)."""
    return [(cast(torch.Tensor, x.keys), cast(torch.Tensor, x.values)) for x in cache.layers]


def describe(forward: StepForward, problem: str | None) -> str:
    """One line for the log: which path runs this model, and why not the fast one."""
    if problem is None:
        return "fast path"
    mode = "batched" if cast(GenericForward, forward).batched else \
        f"one row at a time: {cast(GenericForward, forward).per_row_reason}"
    return f"generic HF-forward path ({mode}), slower than the fast path: {problem}"
