"""A slot-indexed key/value cache that grows and shrinks with the running batch.

Layout: one stacked tensor `kv`, `(2, layers, slots, kv_heads, capacity, head_dim)` (K then V),
and per-layer views `keys[i] = kv[0, i]`, `values[i] = kv[1, i]` of `(slots, kv_heads, capacity,
head_dim)`: each layer's view is exactly the contiguous per-layer tensor of before (head-major:
each (slot, head) is one contiguous run of positions, which batched matmuls read fastest). Running
sequences occupy slots 0..B-1 (the scheduler keeps them compact by moving the last slot into a
hole), so a decode step attends over the strided view `[:B, :, :L]` with no gather copy. Stacking
makes moving a set of slots (`copy_slots`: compaction, a group's shared prefill) one gather and one
scatter over every layer's K and V at once, not one indexed copy per buffer (2 x layers, ~150 on
a 24-layer model, ~4 ms on the GPU after each finish). On the CPU (`stacked` False by default) each
layer's K and V are their own tensors instead, moved one indexed copy each: the host allocator
serves buffers under glibc's mmap threshold (32 MiB) from memory it already holds, while one
stacked tensor over it is mapped fresh, and page-faulted, at every regrowth; the tiny model's
256-slot cache (32 MiB stacked) took ~7 ms a generation round that way (docs/benchmarks.md).

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

from asyncrl.rollout.sizes import pow2_at_least
from asyncrl.rollout.transfer import to_device

Move = tuple[int, int, int]
"""(src, dst, length): slot dst takes slot src's first `length` positions. A negative length swaps
the two slots' first -length positions (a finished sequence's K/V kept as a prefix-cache entry
where the last running slot was, while that slot's sequence takes its place)."""


def compose_moves(moves: Sequence[Move]) -> dict[int, tuple[int, int]]:
    """The moves, in order, as one parallel copy: {dst: (the slot whose contents at the start it
    ends with, positions)}, slots that end with their own contents left out.

    Example: (3, 1, 5), (1, 4, 5) -> {1: (3, 5), 4: (3, 5)}; (3, 1, -5) -> {1: (3, 5), 3: (1, 5)}.
    """
    content: dict[int, tuple[int, int]] = {}
    for src, dst, length in moves:
        if src == dst or length == 0:
            continue
        n = abs(length)
        moved = content.get(src, (src, n))[0]
        if length < 0:
            content[src] = content.get(dst, (dst, n))[0], n
        content[dst] = moved, n
    return {dst: (src, n) for dst, (src, n) in content.items() if src != dst}


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
        stacked: bool | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.max_slots = max_slots
        self.dtype = dtype
        self.device = torch.device(device)
        self.min_capacity = min_capacity
        self.static = static
        self.stacked = self.device.type == "cuda" if stacked is None else stacked
        """One tensor for every layer's K and V (`kv`), or a tensor per buffer (the CPU's default)."""
        self.generation = 0
        """Bumped whenever the buffers are replaced: what was captured over the old ones is stale."""
        self.fixed_capacity = 0
        """Set by `allocate`: every slot of this many positions, allocated once (0: grows)."""
        self.slots = 0
        self.capacity = 0
        self.kv = torch.empty(0)  # stacked: (2, layers, slots, kv_heads, capacity, head_dim): K then V
        self.keys: list[torch.Tensor] = []  # per layer, views of kv: (slots, kv_heads, capacity, head_dim)
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
        want_slots = min(pow2_at_least(max(num_slots, 1), 1), self.max_slots)
        want_cap = pow2_at_least(max(length, 1), self.min_capacity)
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
        s = min(keep_slots, self.slots, slots)
        n = min(keep_len, self.capacity, capacity)
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        if self.stacked:
            kv = torch.zeros((2, self.num_layers, *shape), dtype=self.dtype, device=self.device)
            if s > 0 and n > 0:
                kv[:, :, :s, :, :n] = self.kv[:, :, :s, :, :n]
            self._set(kv)
        else:
            buffers = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * self.num_layers)]
            for new, old in zip(buffers, (*self.keys, *self.values)):
                if s > 0 and n > 0:
                    new[:s, :, :n] = old[:s, :, :n]
            self.keys, self.values = buffers[: self.num_layers], buffers[self.num_layers:]
        self.slots, self.capacity = slots, capacity
        self.generation += 1

    def _set(self, kv: torch.Tensor) -> None:
        self.kv = kv
        self.keys, self.values = list(kv[0].unbind(0)), list(kv[1].unbind(0))

    def apply_moves(self, moves: Sequence[Move]) -> None:
        """The (src, dst, length) moves (`Move`: a negative length swaps), in order, as one
        gather and one scatter (`copy_slots`).

        A step after many sequences finished compacts hundreds of slots. Composed first (a slot
        moved twice ends with its first source's contents, `compose_moves`), then every
        destination is read from the state before any move.
        """
        content = compose_moves(moves)  # dst -> (original src, length)
        pairs = [(dst, src) for dst, (src, _) in content.items()]
        if pairs and self.slots:  # released while idle: nothing to move
            self.copy_slots([d for d, _ in pairs], [s for _, s in pairs], max(n for _, n in content.values()))

    def copy_slots(self, dsts: Sequence[int], srcs: Sequence[int], length: int) -> None:
        """Slot dsts[i] takes slot srcs[i]'s first `length` positions, K and V of every layer,
        all sources read before any write: one gather and one scatter over the stacked cache (one
        of each per buffer when not stacked)."""
        index = to_device(torch.tensor([list(dsts), list(srcs)], dtype=torch.int64), self.device)  # (2, moves)
        n = min(length, self.capacity)
        if self.stacked:
            kv = self.kv[:, :, :, :, :n]
            kv[:, :, index[0]] = kv[:, :, index[1]]  # the right side is a copy: reads see no write
            return
        for buffer in (*self.keys, *self.values):
            buffer[index[0], :, :n] = buffer[index[1], :, :n]

    def release(self) -> None:
        """Drop every buffer (the engine is idle or closing)."""
        self._set(torch.empty(2, 0))  # stacked or not: no buffer left
        self.slots, self.capacity = 0, 0
        self.generation += 1

    @property
    def allocated_tokens(self) -> int:
        return self.slots * self.capacity
