"""Decode steps over static buffers, one per batch-size bucket, replayed from CUDA graphs.

On a GPU an eager decode step of a small model is bound by kernel launches (issue 13: ~110 ms
eager against 2.7 ms captured for a 0.5B model at batch 64). `BucketedDecode` pads each step's
decode rows up to a bucket size (1, 2, 4, 8, then multiples of 16), copies tokens and positions
into that bucket's static input buffers and runs the fast forward with every shape fixed:
attention reads the cache's whole capacity (`BatchedForward.decode(length=capacity)`), masked
per row, over a static `SlotKVCache` (every slot allocated, capacity only grows). On CUDA each
bucket's step is captured once into a `torch.cuda.CUDAGraph` (all buckets share one memory pool)
and replayed; weights are loaded in place, so graphs stay valid across syncs. A cache that grows
or is released bumps its `generation`, and graphs over the old buffers are captured again.

Padding rows (token 0 at position 0) sit in the slots after the real rows: those are free or
belong to this step's prefill rows, which are written after the decode. Their logits are
dropped. On CPU the same code runs eagerly (`capture=False`), which is how the tests check it.

Not here: sampling (eager, after the logits), prefill (eager: its shapes vary), what to decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.kv_cache import SlotKVCache


def bucket_sizes(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to and including `max_rows`.

    Example: max_rows 40 -> [1, 2, 4, 8, 16, 32, 40]."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_rows] + list(range(16, max_rows, 16))
    return [*sizes, max_rows]


@dataclass
class _Bucket:
    tokens: torch.Tensor  # (size,) int64, static input
    positions: torch.Tensor  # (size,) int64, static input
    logits: torch.Tensor | None = None  # (size, V) float32, the graph's output
    graph: torch.cuda.CUDAGraph | None = None
    generation: int = -1  # the cache generation the graph was captured over


class BucketedDecode:
    """Decode rows through per-bucket static buffers; CUDA graphs when `capture`."""

    def __init__(self, forward: BatchedForward, cache: SlotKVCache, max_rows: int, *, capture: bool) -> None:
        assert cache.static, "graphs need a static cache (SlotKVCache(static=True))"
        self.forward = forward
        self.cache = cache
        self.sizes = bucket_sizes(max_rows)
        self.capture = capture
        self.captures = 0
        """Graphs captured so far (a bucket is captured again after the cache grows)."""
        self._buckets: dict[int, _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def __call__(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Logits (len(tokens), V) float32 of one decode step; rows live in slots 0..B-1."""
        b = len(tokens)
        size = next(s for s in self.sizes if s >= b)
        bucket = self._bucket(size)
        pad = size - b
        host = torch.tensor([[*tokens, *[0] * pad], [*positions, *[0] * pad]], dtype=torch.int64)
        bucket.tokens.copy_(host[0], non_blocking=True)
        bucket.positions.copy_(host[1], non_blocking=True)
        if not self.capture:
            return self._run(bucket)[:b]
        if bucket.graph is None or bucket.generation != self.cache.generation:
            self._capture(bucket)
        assert bucket.graph is not None and bucket.logits is not None
        bucket.graph.replay()
        return bucket.logits[:b]

    def _bucket(self, size: int) -> _Bucket:
        if size not in self._buckets:
            device = self.cache.device
            self._buckets[size] = _Bucket(torch.zeros(size, dtype=torch.int64, device=device),
                                          torch.zeros(size, dtype=torch.int64, device=device))
        return self._buckets[size]

    def _run(self, bucket: _Bucket) -> torch.Tensor:
        return self.forward.decode(self.cache, bucket.tokens, bucket.positions, length=self.cache.capacity)

    def _capture(self, bucket: _Bucket) -> None:
        """Warm up on a side stream (as torch requires before capture), then capture. Both runs
        compute this step's real inputs, so their K/V writes are the ones the step makes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            bucket.logits = self._run(bucket)
        bucket.graph, bucket.generation = graph, self.cache.generation
        self.captures += 1
