"""A slot-indexed key/value cache that grows and shrinks with the running batch.

Layout per layer: `(slots, kv_heads, capacity, head_dim)` for keys and for values (head-major:
each (slot, head) is one contiguous run of positions, which batched matmuls read fastest). Running
sequences occupy slots 0..B-1 (the scheduler keeps them compact by moving the last slot into a
hole), so a decode step attends over the strided view `[:B, :, :L]` with no gather copy.

Physical memory is `slots_allocated × capacity` tokens per layer, both rounded up to powers of
two and shrunk with hysteresis; it is NOT bounded by the scheduler's token budget (a long
sequence next to many short ones pads the buffer). The token budget (`kv_budget_tokens`) is an
accounting limit the scheduler enforces on the sum of cached tokens. A static cache on a GPU is
instead allocated once at a size `asyncrl.rollout.memory` computed (`allocate`) and never moves.

This module does no scheduling and no attention; it is touched only by the engine's step thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncrl.rollout.transfer import to_device


def _round_up_pow2(n: int, minimum: int) -> int:
    size = minimum
    while size < n:
        size *= 2
    return size


class SlotKVCache:
    """Per-layer K/V buffers indexed by (slot, position)."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        max_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        min_capacity: int = 64,
        static: bool = False,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.max_slots = max_slots
        self.dtype = dtype
        self.device = torch.device(device)
        self.min_capacity = min_capacity
        self.static = static
        self.generation = 0
        """Bumped whenever the buffers are replaced: what was captured over the old ones is stale."""
        self.fixed_capacity = 0
        """Set by `allocate`: every slot of this many positions, allocated once (0: grows)."""
        self.slots = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []  # per layer: (slots, kv_heads, capacity, head_dim)
        self.values: list[torch.Tensor] = []

    def reserve(self, num_slots: int, length: int) -> None:
        """Make room for `num_slots` slots of `length` positions, keeping current contents.

        Grows to powers of two; shrinks only when the need drops below a quarter of what is
        allocated, so a batch that oscillates around a boundary does not reallocate every step.
        Static: every slot from the start, capacity only grows (the buffers keep their addresses
        between growths, so CUDA graphs captured over them stay valid).
        """
        assert num_slots <= self.max_slots, (num_slots, self.max_slots)
        if self.fixed_capacity:
            assert length <= self.fixed_capacity, (length, self.fixed_capacity)
            if not self.slots:  # released (engine closing): allocate the same again
                self.allocate(self.fixed_capacity)
            return
        if self.static:
            num_slots = self.max_slots
            length = max(length, self.capacity)
        want_slots = min(_round_up_pow2(max(num_slots, 1), 1), self.max_slots)
        want_cap = _round_up_pow2(max(length, 1), self.min_capacity)
        grow = num_slots > self.slots or length > self.capacity
        shrink = want_slots * 4 <= self.slots or want_cap * 4 <= self.capacity
        if grow or shrink:
            self._reallocate(want_slots, want_cap, keep_slots=num_slots, keep_len=length)

    def allocate(self, capacity: int) -> None:
        """Allocate all `max_slots` slots of exactly `capacity` positions, once: `reserve` never
        reallocates afterwards (the sized static cache on a GPU, `asyncrl.rollout.memory`)."""
        assert self.static, "a fixed allocation is the static cache's"
        self.fixed_capacity = capacity
        self._reallocate(self.max_slots, capacity, keep_slots=0, keep_len=0)

    @property
    def bytes_per_token(self) -> int:
        """K and V of one position in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.kv_heads * self.head_dim * element

    def _reallocate(self, slots: int, capacity: int, *, keep_slots: int, keep_len: int) -> None:
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        s = min(keep_slots, self.slots, slots)
        n = min(keep_len, self.capacity, capacity)
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        for layer in range(self.num_layers):
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if s > 0 and n > 0:
                k[:s, :, :n] = self.keys[layer][:s, :, :n]
                v[:s, :, :n] = self.values[layer][:s, :, :n]
            new_k.append(k)
            new_v.append(v)
        self.keys, self.values = new_k, new_v
        self.slots, self.capacity = slots, capacity
        self.generation += 1

    def apply_moves(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """The (src, dst, length) moves, in order, as one gather per buffer.

        A step after many sequences finished compacts hundreds of slots; one copy per move and
        buffer cost ~10 ms there. Composed first (a slot moved twice ends with its first
        source's contents), then every destination is read from the state before any move.
        """
        content: dict[int, tuple[int, int]] = {}  # dst -> (original src, length)
        for src, dst, length in moves:
            if src != dst and length > 0:
                content[dst] = content.get(src, (src, length))[0], length
        pairs = [(dst, src) for dst, (src, _) in content.items() if src != dst]
        if not pairs:
            return
        index = to_device(torch.tensor(pairs, dtype=torch.int64), self.device)  # (moves, 2): dst, src
        dsts, srcs = index[:, 0], index[:, 1]
        n = min(max(length for _, length in content.values()), self.capacity)
        for buf in (*self.keys, *self.values):
            buf[dsts, :, :n] = buf[srcs, :, :n]  # the right side is a copy: reads see no write

    def release(self) -> None:
        """Drop every buffer (the engine is idle or closing)."""
        self.keys, self.values = [], []
        self.slots, self.capacity = 0, 0
        self.generation += 1

    @property
    def allocated_tokens(self) -> int:
        return self.slots * self.capacity
