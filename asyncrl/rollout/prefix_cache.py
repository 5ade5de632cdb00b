"""Automatic prefix caching for `TorchEngine`: finished sequences' K/V kept in the cache slots past
the running ones, reused by a later request whose prompt starts with the same tokens (a
multi-turn episode's next turn, whose prompt is the whole conversation so far).

What vLLM's automatic prefix caching does with blocks, done here within the engine's slot layout
(`asyncrl.rollout.kv_cache`): running sequences occupy slots 0..B-1; a cached entry is one whole
slot past them, holding the K/V of positions 0..len-1 for its `tokens`. This class is the
bookkeeping (no tensors, no I/O): which slot holds which tokens, the index that finds the
longest cached prefix of a prompt, LRU eviction, pins. It returns the slot moves the scheduler
adds to its step plan (`(src, dst, length)`, applied in order, `SlotKVCache.apply_moves`).

- An entry is made when a running sequence leaves (finished or aborted): `retire`. Its tokens are
  what its slot holds, prompt + response minus the last sampled token (never fed, so it has no K/V
  yet), at most `max_len` (padding rows of CUDA-graph decode write at the cache's last position).
  It swaps slots with the last running sequence (which fills the hole), so it needs no free slot.
- A prompt is looked up at admission (`lookup`): the entry sharing its longest common prefix.
  Prompts are indexed by chained hashes of 16-token blocks, so a lookup costs a dict probe per
  block, and a hit needs one whole block in common. The last prompt token is always prefilled
  (its logits are sampled), so a hit reuses at most len(prompt) - 1 positions.
- `place` readies the slot a new sequence takes. A hit the prompt contains whole (the
  conversation's next turn) is consumed: it swaps into the slot (or is taken over where it lies),
  its K/V now the running sequence's, which extends them. A hit the prompt shares only a part of
  (another conversation with the same system prompt) is copied in and stays cached, so its own
  conversation still finds it. An entry in the way moves to a free slot, or is evicted.
- Eviction, least recently used first: when a running sequence needs the slot or the token budget
  (entries count against `rollout.kv_budget_tokens`, and are evicted before any running sequence
  is preempted). A weight load drops every unpinned entry (`drop_unpinned`): their K/V were
  computed by the old weights (vLLM resets its prefix cache on a weight update too).

Pins (`rollout.multi_turn.keep_slot=keep`): `pin(tokens, seconds)` keeps the entry holding a
prefix of `tokens` from eviction for `seconds` (the episode's tool wait), until its next turn
consumes it or `unpin`. A pinned entry is matched only by a prompt that contains all of it (its
own episode's next turn), and survives a weight load, as a running sequence's K/V does. Why a
method rather than a request field: `GenerationRequest` is the `asyncrl.roles.Engine` protocol,
which vLLM engines implement too; a pin is a TorchEngine extra that an episode calls when the
engine has it (`getattr(engine, "pin", None)`), and vLLM users lose nothing.

Not here: block sharing between running sequences (a shared system prompt is copied into each
slot, and computed once only when its rows are admitted together: the runner's group prefill),
the generic path's per-row HF cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncrl.rollout.kv_cache import Move

BLOCK = 16
"""Tokens per indexed block: the least a hit reuses."""


@dataclass(eq=False)
class CachedPrefix:
    """One cached slot: the K/V of `tokens` at positions 0..len(tokens)-1 of `slot`."""

    tokens: tuple[int, ...]
    slot: int
    last_used: int
    hashes: tuple[int, ...]  # chained hash of each whole block of `tokens`
    pinned_until: float = 0.0  # the clock's time until which it is not evicted (0: evictable)


def block_hashes(ids: Sequence[int]) -> list[int]:
    """Chained hash of each whole `BLOCK` of ids: hash i covers ids[: BLOCK * (i + 1)]."""
    hashes, h = [], 0
    for b in range(len(ids) // BLOCK):
        h = hash((h, tuple(ids[b * BLOCK : (b + 1) * BLOCK])))
        hashes.append(h)
    return hashes


class PrefixCache:
    """Cached prefixes in slots [running, max_slots), found by token prefix, evicted LRU."""

    def __init__(self, max_slots: int, max_len: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`max_slots`: the KV cache's slots; `max_len`: the most positions an entry keeps."""
        self.max_slots = max_slots
        self.max_len = max_len
        self._clock = clock
        self._by_slot: dict[int, CachedPrefix] = {}
        self._index: dict[int, set[CachedPrefix]] = {}  # block hash -> entries holding that block chain
        self._tick = 0
        self.tokens = 0
        """Tokens held by all entries (counted against the KV token budget)."""
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._by_slot)

    @property
    def top_slot(self) -> int:
        """One past the highest slot an entry holds (0: none)."""
        return max(self._by_slot, default=-1) + 1

    @property
    def longest(self) -> int:
        return max((len(e.tokens) for e in self._by_slot.values()), default=0)

    # ---- entries in and out ----

    def retire(self, tokens: Sequence[int], slot: int) -> int:
        """A running sequence leaves, its K/V of `tokens` ending up in `slot` (free of entries:
        the last running slot, which the scheduler swaps it into). Returns the positions kept
        (0: too short to be worth an entry)."""
        tokens = tuple(tokens[: self.max_len])
        if len(tokens) < BLOCK:
            return 0
        assert slot not in self._by_slot, slot
        self._add(tokens, slot)
        return len(tokens)

    def lookup(self, ids: Sequence[int]) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with `ids`, and how many of its positions a
        prefill of `ids` reuses (at most len(ids) - 1); (None, 0) without a whole block in common.
        A pinned entry is matched only when `ids` contains all of its tokens."""
        levels: list[set[CachedPrefix]] = []  # entries sharing 1, 2, ... whole blocks with ids
        for h in block_hashes(ids[: len(ids) - 1]):
            found = self._index.get(h)
            if not found:
                break
            levels.append(found)
        now = self._clock()
        for blocks in range(len(levels), 0, -1):  # the deepest level's entries share the most
            best, best_len = None, 0
            for entry in levels[blocks - 1]:
                n = self._common(entry.tokens, ids, blocks * BLOCK)
                if entry.pinned_until > now and n < len(entry.tokens):
                    continue  # another episode's: only its own next turn takes it
                if n > best_len:
                    best, best_len = entry, n
            if best is not None:
                return best, min(best_len, len(ids) - 1)
        return None, 0

    def place(self, slot: int, hit: CachedPrefix | None, reuse: int = 0) -> list[Move] | None:
        """Ready `slot` for a new running sequence whose first `reuse` positions are `hit`'s.
        A hit it extends whole (its conversation's next turn) is consumed: it moves in, swapping
        with the entry sitting there. A hit it shares only a part of (another conversation with
        the same system prompt) stays cached and is copied in. The entry sitting in `slot`
        otherwise moves to a free slot, or is evicted. None (nothing changed) when that entry is
        pinned and no slot is free or evictable."""
        occupant = self._by_slot.get(slot)
        if hit is not None and self.consumes(hit, reuse):
            source = hit.slot
            self._remove(hit)
            if source == slot:
                return []
            if occupant is None:
                return [(source, slot, len(hit.tokens))]
            self._move(occupant, source)
            return [(source, slot, -max(len(hit.tokens), len(occupant.tokens)))]
        moves: list[Move] = []
        if occupant is not None:
            out = self._make_way(occupant, hit)
            if out is None and occupant is hit:  # nowhere to keep it: the sequence takes it over
                self._remove(hit)
                return []
            if out is None:
                return None
            moves += out
        if hit is not None:  # copied in, and kept as recently used
            self._tick += 1
            hit.last_used = self._tick
            moves.append((hit.slot, slot, reuse))
        return moves

    @staticmethod
    def consumes(hit: CachedPrefix, reuse: int) -> bool:
        """Whether a sequence reusing `reuse` positions of `hit` takes it over (all of it: its
        conversation's next turn) rather than copying it."""
        return reuse >= len(hit.tokens)

    def _make_way(self, occupant: CachedPrefix, hit: CachedPrefix | None) -> list[Move] | None:
        """Move `occupant` out of its slot to a free one, or evict it, or (pinned, or the hit)
        move it to an evicted LRU entry's slot; None when none of these is possible."""
        slot = occupant.slot
        target = self._free_slot(slot + 1)
        if target is None and occupant is not hit and occupant.pinned_until <= self._clock():
            self._evict(occupant)
            return []
        if target is None:
            victim = self._lru(spare=hit if hit is not None else occupant)
            if victim is None or victim is occupant:
                return None
            target = victim.slot
            self._evict(victim)
        self._move(occupant, target)
        return [(slot, target, len(occupant.tokens))]

    def evict(self, tokens: int, spare: CachedPrefix | None = None) -> int:
        """Evict LRU unpinned entries (never `spare`) until `tokens` are freed; returns the tokens freed."""
        freed = 0
        while freed < tokens:
            victim = self._lru(spare=spare)
            if victim is None:
                break
            freed += len(victim.tokens)
            self._evict(victim)
        return freed

    def drop_unpinned(self) -> None:
        """Drop every entry not pinned now (a weight load made their K/V stale)."""
        now = self._clock()
        for entry in [e for e in self._by_slot.values() if e.pinned_until <= now]:
            self._remove(entry)

    def clear(self) -> None:
        self._by_slot, self._index, self.tokens = {}, {}, 0

    # ---- pins ----

    def pin(self, ids: Sequence[int], seconds: float) -> bool:
        """Keep the entry whose tokens are all a prefix of `ids` from eviction for `seconds`;
        False when there is none (not cached, or evicted already)."""
        entry = self._holding(ids)
        if entry is not None:
            entry.pinned_until = self._clock() + seconds
        return entry is not None

    def unpin(self, ids: Sequence[int]) -> bool:
        entry = self._holding(ids)
        if entry is not None:
            entry.pinned_until = 0.0
        return entry is not None

    def pinned_for(self) -> float | None:
        """Seconds until the first pin in force expires (None: no pin): an engine whose waiting
        requests are blocked by pinned slots looks again then."""
        now = self._clock()
        pins = [e.pinned_until - now for e in self._by_slot.values() if e.pinned_until > now]
        return min(pins, default=None)

    def _holding(self, ids: Sequence[int]) -> CachedPrefix | None:
        best: CachedPrefix | None = None
        hashes = set(block_hashes(ids))
        for entry in self._by_slot.values():
            whole = len(entry.tokens) <= len(ids) and (not entry.hashes or entry.hashes[-1] in hashes)
            if whole and entry.tokens == tuple(ids[: len(entry.tokens)]):
                if best is None or len(entry.tokens) > len(best.tokens):
                    best = entry
        return best

    # ---- internals ----

    @staticmethod
    def _common(tokens: tuple[int, ...], ids: Sequence[int], known: int) -> int:
        """Length of the common prefix of `tokens` and `ids`, the first `known` agreeing by hash
        (checked: a hash collision must not reuse wrong K/V)."""
        if tokens[:known] != tuple(ids[:known]):
            return 0
        n, end = known, min(len(tokens), len(ids))
        while n < end and tokens[n] == ids[n]:
            n += 1
        return n

    def _free_slot(self, start: int) -> int | None:
        return next((s for s in range(start, self.max_slots) if s not in self._by_slot), None)

    def _lru(self, spare: CachedPrefix | None = None) -> CachedPrefix | None:
        now = self._clock()
        evictable = [e for e in self._by_slot.values() if e.pinned_until <= now and e is not spare]
        return min(evictable, key=lambda e: e.last_used, default=None)

    def _add(self, tokens: tuple[int, ...], slot: int) -> None:
        self._tick += 1
        entry = CachedPrefix(tokens, slot, self._tick, tuple(block_hashes(tokens)))
        self._by_slot[slot] = entry
        for h in entry.hashes:
            self._index.setdefault(h, set()).add(entry)
        self.tokens += len(tokens)

    def _move(self, entry: CachedPrefix, slot: int) -> None:
        del self._by_slot[entry.slot]
        entry.slot = slot
        self._by_slot[slot] = entry

    def _evict(self, entry: CachedPrefix) -> None:
        self.evictions += 1
        self._remove(entry)

    def _remove(self, entry: CachedPrefix) -> None:
        del self._by_slot[entry.slot]
        for h in entry.hashes:
            holders = self._index[h]
            holders.discard(entry)
            if not holders:
                del self._index[h]
        self.tokens -= len(entry.tokens)
