"""Decode steps over static buffers, keyed by (batch bucket, attention length), replayed from
CUDA graphs.

On a GPU an eager decode step of a small model is bound by kernel launches (issue 13: ~110 ms
eager against 2.7 ms captured for a 0.5B model at batch 64). `BucketedDecode` pads each step's
decode rows up to a bucket size (1, 2, 4, 8, then multiples of 16), copies tokens and positions
into static input buffers and runs the fast forward with every shape fixed: attention reads the
first L cached positions, L = `attention_length` (a power of two >= the furthest row's position
+ 1, at least 128, at most the cache's capacity), masked per row, over a static `SlotKVCache`.
Reading L rather than the whole capacity keeps a short-context step from paying for a cache
sized for the longest sequence.

On CUDA each (bucket, L) step is captured once, lazily, into a `torch.cuda.CUDAGraph`; all graphs
share one memory pool and write their logits into one output buffer (so the pool holds one
step's temporaries, not one set per graph). Capture uses `capture_error_mode="thread_local"`:
the engine's step thread captures while a trainer thread in the same process may run CUDA work,
which the default global mode would make fail. Weights are loaded in place, so graphs stay
valid across syncs. A cache whose buffers are replaced bumps its `generation`, and graphs over
the old buffers are captured again (the sized GPU cache is allocated once; on the CPU the cache
grows, but nothing is captured there).

Padding rows (token 0 at position 0) sit in the slots after the real rows: those are free or
belong to this step's prefill rows, which are written after the decode. Their logits are
dropped. On CPU the same code runs eagerly (`capture=False`), which is how the tests check it.

Not here: sampling (eager, after the logits), prefill (eager: its shapes vary), what to decode.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import torch

from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.transfer import copy_from_host

MIN_ATTENTION_LENGTH = 128


def bucket_sizes(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to and including `max_rows`.

    Example: max_rows 40 -> [1, 2, 4, 8, 16, 32, 40]."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_rows] + list(range(16, max_rows, 16))
    return [*sizes, max_rows]


def attention_length(max_position: int, capacity: int, minimum: int = MIN_ATTENTION_LENGTH) -> int:
    """Cached positions a decode step reads: the smallest power of two >= max_position + 1, at
    least `minimum`, at most `capacity` (which must hold max_position).

    Example: capacity 2304: max_position 5 -> 128, 127 -> 128, 128 -> 256, 300 -> 512,
    2100 -> 2304."""
    assert max_position < capacity, (max_position, capacity)
    length = minimum
    while length < max_position + 1:
        length *= 2
    return min(length, capacity)


class BucketedDecode:
    """Decode rows through static buffers, one graph per (bucket, attention length) when `capture`."""

    def __init__(self, forward: BatchedForward, cache: SlotKVCache, max_rows: int, *, capture: bool) -> None:
        assert cache.static, "graphs need a static cache (SlotKVCache(static=True))"
        assert max_rows <= cache.max_slots, "padding rows need slots of their own"
        self.forward = forward
        self.cache = cache
        self.sizes = bucket_sizes(max_rows)
        self.capture = capture
        self.captures = 0
        """Graphs captured so far (a key is captured again after the cache's buffers change)."""
        self.capture_s = 0.0
        """Wall time spent capturing them (warm-up run included)."""
        self.steps: Counter[tuple[int, int]] = Counter()
        """Decode steps per (bucket, attention length) key, keys in the order first run."""
        device = cache.device
        self._inputs = torch.zeros(max_rows, 2, dtype=torch.int64, device=device)  # (rows, token|position)
        self._logits = torch.zeros(max_rows, forward.vocab_size, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, int]] = {}  # key -> (graph, generation)
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def __call__(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Logits (len(tokens), V) float32 of one decode step; rows live in slots 0..B-1. The
        result is a view of a buffer the next step overwrites."""
        b = len(tokens)
        size = next(s for s in self.sizes if s >= b)
        length = attention_length(max(positions), self.cache.capacity)
        host = torch.zeros(size, 2, dtype=torch.int64)  # padding rows: token 0 at position 0
        host[:b, 0] = torch.tensor(tokens, dtype=torch.int64)
        host[:b, 1] = torch.tensor(positions, dtype=torch.int64)
        copy_from_host(self._inputs[:size], host)
        key = (size, length)
        self.steps[key] += 1
        if not self.capture:
            self._run(size, length)
            return self._logits[:b]
        graph, generation = self._graphs.get(key, (None, -1))
        if graph is None or generation != self.cache.generation:
            graph = self._capture(size, length)
        graph.replay()
        return self._logits[:b]

    def _run(self, size: int, length: int) -> None:
        inputs = self._inputs[:size]
        self.forward.decode(self.cache, inputs[:, 0], inputs[:, 1], length=length, out=self._logits[:size])

    def _capture(self, size: int, length: int) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (as torch requires before capture), then capture. Both runs
        compute this step's real inputs, so their K/V writes are the ones the step makes."""
        start = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(size, length)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._run(size, length)
        self._graphs[(size, length)] = graph, self.cache.generation
        self.captures += 1
        self.capture_s += time.perf_counter() - start
        return graph
