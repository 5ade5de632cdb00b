"""Decode steps over static buffers, keyed by batch bucket (and attention length, on the matmul
attention path), replayed from CUDA graphs.

On a GPU an eager decode step of a small model is bound by kernel launches (issue 13: ~110 ms
eager against 2.7 ms captured for a 0.5B model at batch 64). `BucketedDecode` pads each step's
decode rows up to a bucket size (1, 2, 4, 8, then multiples of 16), copies positions and lengths
into static input buffers, reads each row's input token from the sampler's device buffer (the
token its slot sampled last step), runs the fast forward and samples every row into the
sampler's buffers (`asyncrl.rollout.sampler.DeviceSampler`), every shape fixed, over a static
`SlotKVCache`. What attention reads depends on the forward's path (`asyncrl.rollout.attention`):
- triton (CUDA's default): each row's own length (position + 1; 0 for a padding row) from the
  static input buffer, so the key is the bucket alone (its length part is 0): one graph per bucket;
- matmul (the CPU's): the first L cached positions of every row, L = `attention_length` (a power
  of two >= the furthest row's position + 1, at least 128, at most the cache's capacity), masked
  per row; reading L rather than the whole capacity keeps a short-context step from paying for a
  cache sized for the longest sequence, and the key is (bucket, L).
(What each path reads per step is the engine bench's count: `bench/engine_diag.py`'s `KVReads`.)

On CUDA each key, with the step's sampling mode, is captured once, lazily, into a `torch.cuda.CUDAGraph`; all graphs
share one memory pool and write their logits into one output buffer (so the pool holds one
step's temporaries, not one set per graph). Capture uses `capture_error_mode="thread_local"`:
the engine's step thread captures while a trainer thread in the same process may run CUDA work,
which the default global mode would make fail. Weights are loaded in place, so graphs stay
valid across syncs. A cache whose buffers are replaced bumps its `generation`, and graphs over
the old buffers are captured again (the sized GPU cache is allocated once; on the CPU the cache
grows, but nothing is captured there). `CapturedGraphs` is that capture, written once for the
decode and the prefill buckets.

Padding rows (at the cache's last position, length 0, whatever token their slot sampled last)
sit in the slots after the real rows: those are free, or belong to this step's prefill rows,
whose K/V and sampled tokens are written after the decode, or hold a prefix-cache entry, which
never reaches the last position (the runner keeps one more). What they sample is never read. On CPU the same code runs
eagerly (`capture=False`), which is how the tests check it.

`BucketedPrefill` does the same for the packed prefill on CUDA (`asyncrl.rollout.prefill`): its
token count rounded up to a bucket, one graph per (token bucket, row bucket).

Not here: what to decode or prefill, reading the sampled tokens, timing replays (the engine
bench's `bench/engine_diag.py`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import torch

from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.prefill import PackedPrompts, PrefillPath, layout_size, pack_prompts
from asyncrl.rollout.sampler import DeviceSampler, SamplingMode
from asyncrl.rollout.sizes import pow2_at_least
from asyncrl.rollout.transfer import copy_from_host, to_device

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
    return min(pow2_at_least(max_position + 1, minimum), capacity)


class _Bucketed:
    """What the decode and prefill buckets report of their graphs."""

    graphs: CapturedGraphs | None
    """None: run eagerly (no capture)."""

    @property
    def captures(self) -> int:
        """Graphs captured so far (a key is captured again after the cache's buffers change)."""
        return 0 if self.graphs is None else self.graphs.captures

    @property
    def capture_s(self) -> float:
        """Wall time spent capturing them (warm-up runs included)."""
        return 0.0 if self.graphs is None else self.graphs.capture_s


class BucketedDecode(_Bucketed):
    """Decode rows through static buffers, one graph per key (bucket, attention length; 0 when
    the forward reads real lengths; and the sampling mode) when `capture`."""

    def __init__(self, forward: BatchedForward, cache: SlotKVCache, max_rows: int, sampler: DeviceSampler, *,
                 capture: bool) -> None:
        assert cache.static, "graphs need a static cache (SlotKVCache(static=True))"
        assert max_rows <= cache.max_slots, "padding rows need slots of their own"
        self.forward = forward
        self.cache = cache
        self.sampler = sampler
        self.sizes = bucket_sizes(max_rows)
        self.capture = capture
        self.graphs = CapturedGraphs(cache) if capture else None
        """The captured graphs, keyed (bucket, attention length, sampling mode); None: eager."""
        self.steps: Counter[tuple[int, int]] = Counter()
        """Decode steps per (bucket, attention length) key, keys in the order first run."""
        self._reads_length = forward.decode_attention == "triton"
        device = cache.device
        self._inputs = torch.zeros(max_rows, 2, dtype=torch.int64, device=device)  # (rows, position|length)
        self._logits = torch.zeros(max_rows, forward.vocab_size, dtype=torch.float32, device=device)
        self._modes: dict[tuple[int, int], SamplingMode] = {}  # key -> the sampling mode it last ran

    def __call__(self, positions: Sequence[int], mode: SamplingMode) -> None:
        """One decode step of the rows in slots 0..B-1 at `positions`, each fed its slot's last
        sampled token, sampled under `mode` into the sampler's `tokens` and `logprobs`."""
        b = len(positions)
        size, length = key = self.key(positions)
        host = torch.zeros(size, 2, dtype=torch.int64)  # padding rows: the last position, length 0
        host[b:, 0] = self.cache.capacity - 1
        host[:b, 0] = torch.tensor(positions, dtype=torch.int64)
        host[:b, 1] = host[:b, 0] + 1
        copy_from_host(self._inputs[:size], host)
        self.steps[key] += 1
        self._modes[key] = mode
        if self.graphs is None:
            self._run(size, length, mode)
            return
        # the warm-up before a capture samples over the input tokens: the capture needs them back
        self.graphs.replay((size, length, mode), lambda: self._run(size, length, mode),
                           keep=self.sampler.tokens[:size])

    def key(self, positions: Sequence[int]) -> tuple[int, int]:
        """The (bucket, attention length) key of a step of rows at `positions`; the length is 0 where
        the kernel reads each row's length from the inputs (one graph per bucket)."""
        size = next(s for s in self.sizes if s >= len(positions))
        return size, 0 if self._reads_length else attention_length(max(positions), self.cache.capacity)

    def _run(self, size: int, length: int, mode: SamplingMode) -> None:
        inputs, logits = self._inputs[:size], self._logits[:size]
        self.forward.decode(self.cache, self.sampler.tokens[:size], inputs[:, 0], length=length or None,
                            lengths=inputs[:, 1], out=logits)
        self.sampler.sample_rows(logits, 0, mode)

    def step_of(self, key: tuple[int, int], *, eager: bool = False) -> Callable[[], None]:
        """`key`'s last step again, sampling included: its graph's replay on CUDA (unless `eager`:
        the calls it captured, run eagerly), else the eager step. For the engine bench; it rewrites
        the cache positions that step wrote."""
        mode = self._modes[key]
        if self.graphs is not None and not eager:
            return self.graphs.replay_of((*key, mode))
        return lambda: self._run(*key, mode)


MIN_PREFILL_TOKENS = 64


def prefill_token_buckets(max_tokens: int, minimum: int = MIN_PREFILL_TOKENS) -> list[int]:
    """Powers of two from `minimum` below `max_tokens`, then `max_tokens`: a packed prefill's
    token count is rounded up to one (at most 2x the real tokens, never past the prefill budget
    the memory plan reserves activations for).

    Example: max_tokens 4096 -> [64, 128, 256, 512, 1024, 2048, 4096]; 100 -> [64, 100]; 40 -> [40]."""
    sizes: list[int] = []
    size = minimum
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return [*sizes, max_tokens]


class BucketedPrefill(_Bucketed):
    """Packed prefills (`BatchedForward.prefill_packed`) through static buffers, one graph per
    (token bucket, row bucket) when `capture`.

    A step's prompts are packed (`asyncrl.rollout.prefill.pack_prompts`) to T tokens, the next
    of `prefill_token_buckets`, in R rows, the next of `bucket_sizes`: the dummy tail extends the
    last prompt (written past its end in its own slot, never read) and rows past the real ones
    are empty. The varlen kernel takes the rows' longest length as a host int (`max_seqlen`,
    which sizes its grid); a graph fixes it at capture, so it is T, which bounds every row, the
    tail-extended last one included: the kernel then launches ceil(T / 128) query blocks per
    row and head, and those past a row's end return at once (at most R times the blocks the
    real rows need; R = 1 when the step admits one prompt). Keying graphs by the longest row
    too would multiply their number for a saving in empty blocks.

    A prompt set longer than the largest bucket runs eagerly (`eager`), packed, unpadded. The
    logits of a step land in one static (rows, V) buffer, the next prefill overwrites them;
    graphs have a memory pool of their own (prefill temporaries are far larger than decode's).
    """

    def __init__(self, forward: BatchedForward, cache: SlotKVCache, max_rows: int, max_tokens: int, *,
                 path: PrefillPath, capture: bool) -> None:
        assert cache.static, "graphs need a static cache (SlotKVCache(static=True))"
        self.forward = forward
        self.cache = cache
        self.path = path
        self.token_sizes = prefill_token_buckets(max_tokens)
        self.row_sizes = bucket_sizes(max_rows)
        self.capture = capture
        self.graphs = CapturedGraphs(cache) if capture else None
        """The captured graphs, keyed (token bucket, row bucket), in a pool of their own (prefill
        temporaries are far larger than decode's); None: eager."""
        self.steps: Counter[tuple[int, int]] = Counter()
        """Prefills per (token bucket, row bucket) key, in the order first run."""
        self.eager = 0
        """Prefills longer than the largest bucket, run eagerly."""
        device = cache.device
        self._flat = torch.zeros(layout_size(self.token_sizes[-1], max_rows), dtype=torch.int64, device=device)
        self._logits = torch.zeros(max_rows, forward.vocab_size, dtype=torch.float32, device=device)

    def __call__(self, contexts: Sequence[Sequence[int]], first_slot: int) -> torch.Tensor:
        """Logits (len(contexts), V) float32 of each prompt's last token; prompts go to slots
        first_slot.. . The result is a view of a buffer the next prefill overwrites."""
        n, real = len(contexts), sum(len(c) for c in contexts)
        if real > self.token_sizes[-1]:
            self.eager += 1
            flat, lengths = pack_prompts(contexts, first_slot)
            packed = PackedPrompts.view(to_device(flat, self.cache.device), real, n, lengths, max(lengths))
            return self.forward.prefill_packed(self.cache, packed, self.path)
        key = next(t for t in self.token_sizes if t >= real), next(r for r in self.row_sizes if r >= n)
        flat, lengths = pack_prompts(contexts, first_slot, tokens=key[0], rows=key[1], capacity=self.cache.capacity)
        copy_from_host(self._flat[: flat.numel()], flat)
        self.steps[key] += 1
        if self.graphs is None:
            self._run(key, lengths)
        else:
            self.graphs.replay(key, lambda: self._run(key, lengths))
        return self._logits[:n]

    def _run(self, key: tuple[int, int], lengths: tuple[int, ...]) -> None:
        tokens, rows = key
        packed = PackedPrompts.view(self._flat, tokens, rows, lengths, longest=tokens)
        self.forward.prefill_packed(self.cache, packed, self.path, out=self._logits[:rows])


class CapturedGraphs:
    """CUDA graphs by key over one cache, captured lazily into one memory pool, and captured again
    once the cache's buffers are replaced (`SlotKVCache.generation`): the decode and the prefill
    buckets each hold one."""

    def __init__(self, cache: SlotKVCache) -> None:
        self.cache = cache
        self.captures = 0
        """Graphs captured so far."""
        self.capture_s = 0.0
        """Wall time spent capturing them (warm-up runs included)."""
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, int]] = {}  # key -> (graph, cache generation)
        self._pool = torch.cuda.graph_pool_handle()

    def __len__(self) -> int:
        return len(self._graphs)

    def replay(self, key: Hashable, run: Callable[[], None], *, keep: torch.Tensor | None = None) -> None:
        """Replay `key`'s graph, capturing `run` first when there is none over today's buffers."""
        graph, generation = self._graphs.get(key, (None, -1))
        if graph is None or generation != self.cache.generation:
            graph = self._capture(key, run, keep)
        graph.replay()

    def replay_of(self, key: Hashable) -> Callable[[], None]:
        """`key`'s captured replay (for the engine bench's floors)."""
        return self._graphs[key][0].replay

    def _capture(self, key: Hashable, run: Callable[[], None], keep: torch.Tensor | None) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (as torch requires before capture), then capture. Both see
        this step's real inputs, so their K/V writes are the ones the step makes; `keep`, which
        the warm-up overwrites and the capture reads, is put back in between."""
        start = time.perf_counter()
        kept = None if keep is None else keep.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        if keep is not None and kept is not None:
            keep.copy_(kept)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            run()
        self._graphs[key] = graph, self.cache.generation
        self.captures += 1
        self.capture_s += time.perf_counter() - start
        return graph
