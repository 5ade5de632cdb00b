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
`kv_reads` sums what each would read (`KVReads`; `kv_bytes_per_step` for the engine bench).

On CUDA each key, with the step's sampling mode, is captured once, lazily, into a `torch.cuda.CUDAGraph`; all graphs
share one memory pool and write their logits into one output buffer (so the pool holds one
step's temporaries, not one set per graph). Capture uses `capture_error_mode="thread_local"`:
the engine's step thread captures while a trainer thread in the same process may run CUDA work,
which the default global mode would make fail. Weights are loaded in place, so graphs stay
valid across syncs. A cache whose buffers are replaced bumps its `generation`, and graphs over
the old buffers are captured again (the sized GPU cache is allocated once; on the CPU the cache
grows, but nothing is captured there).

Padding rows (at the cache's last position, length 0, whatever token their slot sampled last)
sit in the slots after the real rows: those are free, or belong to this step's prefill rows,
whose K/V and sampled tokens are written after the decode, or hold a prefix-cache entry, which
never reaches the last position (the runner keeps one more). What they sample is never read. On CPU the same code runs
eagerly (`capture=False`), which is how the tests check it.

`BucketedPrefill` does the same for the packed prefill on CUDA (`asyncrl.rollout.prefill`): its
token count rounded up to a bucket, one graph per (token bucket, row bucket).

Not here: what to decode or prefill, reading the sampled tokens.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


@dataclass
class KVReads:
    """Cached positions the decode attention reads, summed over decode steps: `real`, each row's
    own length (what the split-KV kernel reads); `padded`, the bucket's rows to the attention
    length (what the matmul path reads, padding rows included).

    Example: rows at positions 99 and 299 in bucket 2: real 100 + 300 = 400, padded 2 x 512 = 1,024."""

    steps: int = 0
    real: int = 0
    padded: int = 0

    def add(self, positions: Sequence[int], bucket: int, capacity: int) -> None:
        self.steps += 1
        self.real += sum(positions) + len(positions)
        self.padded += bucket * attention_length(max(positions), capacity)


class BucketedDecode:
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
        self.captures = 0
        """Graphs captured so far (a key is captured again after the cache's buffers change)."""
        self.capture_s = 0.0
        """Wall time spent capturing them (warm-up run included)."""
        self.steps: Counter[tuple[int, int]] = Counter()
        """Decode steps per (bucket, attention length) key, keys in the order first run."""
        self.kv_reads = KVReads()
        """KV positions read by the steps so far, real and padded (`kv_bytes_per_step`)."""
        self._reads_length = forward.attention == "triton"
        device = cache.device
        self._inputs = torch.zeros(max_rows, 2, dtype=torch.int64, device=device)  # (rows, position|length)
        self._logits = torch.zeros(max_rows, forward.vocab_size, dtype=torch.float32, device=device)
        # (bucket, length, sampling mode) -> (graph, the cache generation it was captured over)
        self._graphs: dict[tuple[int, int, SamplingMode], tuple[torch.cuda.CUDAGraph, int]] = {}
        self._modes: dict[tuple[int, int], SamplingMode] = {}  # key -> the sampling mode it last ran
        self._pool = torch.cuda.graph_pool_handle() if capture else None

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
        self.kv_reads.add(positions, size, self.cache.capacity)
        self.steps[key] += 1
        self._modes[key] = mode
        if not self.capture:
            self._run(size, length, mode)
            return
        graph, generation = self._graphs.get((*key, mode), (None, -1))
        if graph is None or generation != self.cache.generation:
            graph = self._capture(size, length, mode)
        graph.replay()

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

    def kv_bytes_per_step(self) -> dict[str, float]:
        """Mean KV-cache bytes (K and V, every layer) decode attention reads per step so far:
        `real` (each row's own length), `padded` (the matmul path: the bucket's rows to the
        attention length) and `read` (the path this forward takes). For the engine bench."""
        per_step = self.cache.bytes_per_token / max(self.kv_reads.steps, 1)
        real, padded = self.kv_reads.real * per_step, self.kv_reads.padded * per_step
        return {"real": real, "padded": padded, "read": real if self._reads_length else padded}

    def _capture(self, size: int, length: int, mode: SamplingMode) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (as torch requires before capture), then capture. Both see
        this step's real inputs, so their K/V writes are the ones the step makes; the warm-up
        samples over its input tokens, which are put back for the replay that follows."""
        start = time.perf_counter()
        tokens = self.sampler.tokens[:size].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(size, length, mode)
        torch.cuda.current_stream().wait_stream(side)
        self.sampler.tokens[:size].copy_(tokens)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._run(size, length, mode)
        self._graphs[(size, length, mode)] = graph, self.cache.generation
        self.captures += 1
        self.capture_s += time.perf_counter() - start
        return graph

    def replay_s(self, key: tuple[int, int], iters: int) -> float:
        """Mean seconds of one replay of `key`'s step (its graph on CUDA, eager on the CPU), for the
        engine bench's own-mix floor. Replays rewrite the cache positions that step wrote: run it
        only after the engine is done with the cache."""
        return mean_seconds(self.step_of(key), iters, self.cache.device if self.capture else None)

    def step_of(self, key: tuple[int, int], *, eager: bool = False) -> Callable[[], None]:
        """`key`'s last step again, sampling included: its graph's replay on CUDA (unless `eager`:
        the calls it captured, run eagerly), else the eager step. For the engine bench; it rewrites
        the cache positions that step wrote."""
        mode = self._modes[key]
        if self.capture and not eager:
            return self._graphs[(*key, mode)][0].replay
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


class BucketedPrefill:
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
        self.captures = 0
        self.capture_s = 0.0
        self.steps: Counter[tuple[int, int]] = Counter()
        """Prefills per (token bucket, row bucket) key, in the order first run."""
        self.eager = 0
        """Prefills longer than the largest bucket, run eagerly."""
        device = cache.device
        self._flat = torch.zeros(layout_size(self.token_sizes[-1], max_rows), dtype=torch.int64, device=device)
        self._logits = torch.zeros(max_rows, forward.vocab_size, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, int]] = {}  # key -> (graph, generation)
        self._pool = torch.cuda.graph_pool_handle() if capture else None

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
        if not self.capture:
            self._run(key, lengths)
            return self._logits[:n]
        graph, generation = self._graphs.get(key, (None, -1))
        if graph is None or generation != self.cache.generation:
            graph = self._capture(key, lengths)
        graph.replay()
        return self._logits[:n]

    def _run(self, key: tuple[int, int], lengths: tuple[int, ...]) -> None:
        tokens, rows = key
        packed = PackedPrompts.view(self._flat, tokens, rows, lengths, longest=tokens)
        self.forward.prefill_packed(self.cache, packed, self.path, out=self._logits[:rows])

    def _capture(self, key: tuple[int, int], lengths: tuple[int, ...]) -> torch.cuda.CUDAGraph:
        """As `BucketedDecode._capture`: a warm-up on a side stream, then the capture, both over
        this step's real inputs (their K/V writes are the step's own)."""
        start = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(key, lengths)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._run(key, lengths)
        self._graphs[key] = graph, self.cache.generation
        self.captures += 1
        self.capture_s += time.perf_counter() - start
        return graph

    def replay_s(self, key: tuple[int, int], iters: int) -> float:
        """Mean seconds of one replay of `key`'s graph, for the engine bench's own-mix floor. A
        replay rewrites the K/V of the last prefill run under that key: run it only after the
        engine is done with the cache."""
        assert self.capture, "replay times are a captured graph's"
        return mean_seconds(self._graphs[key][0].replay, iters, self.cache.device)


def mean_seconds(step: Callable[[], None], iters: int, cuda: torch.device | None) -> float:
    """Mean seconds of `step` over `iters` calls after one warm-up; on `cuda`, synchronised around them."""
    step()
    if cuda is not None:
        torch.cuda.synchronize(cuda)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda is not None:
        torch.cuda.synchronize(cuda)
    return (time.perf_counter() - start) / iters
