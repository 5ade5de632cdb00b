"""The step thread's side of the engine: run one `StepPlan` on the model, swap weights safely.

`StepRunner.run` applies the plan's slot moves, sizes the KV cache, runs the batched decode and
prefill forwards, samples, and returns plain Python lists. It holds `lock` for the whole step;
`load_weights` takes the same lock, so weights change only between steps whichever thread calls
it. On CUDA with `cuda_graphs` the KV cache is sized from the device's memory and allocated when
the runner is built (`asyncrl.rollout.memory`); `max_num_seqs` then says how many sequences fit.
A step's inputs go to the device without waiting for it (`asyncrl.rollout.transfer`); its rows
are sampled on the device (`asyncrl.rollout.sampler.DeviceSampler`, inside the decode graph
where there is one), the sampled tokens stay there as the next decode's input, and the results
come back in one device-to-host copy. On a GPU they are read one step late: `run(plan)` queues
`plan`'s step and then returns the previous step's results, so the host plans and queues step t+1
while step t runs, and waits only for step t's copy; `flush` reads the last step's results. Where
the device is the host (the CPU) nothing runs while the host plans, so a late read would only add
steps (a row that finished in step t still gets a row in step t+1): `run` returns `plan`'s own
results (`read_late` False). With a prefix cache (`asyncrl.rollout.prefix_cache`) a plan's
entries live in the slots past its rows: the cache is sized for them before the moves, and a
prefill row whose slot holds a hit's positions computes only the rest (`_prefill_after`).
This module does no scheduling and knows nothing about asyncio or futures.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from asyncrl.errors import ConfigError
from asyncrl.models.weights import load_into
from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.generic import GenericForward, StepCache, StepForward, build_forward
from asyncrl.rollout.graphs import BucketedDecode, BucketedPrefill
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.memory import KVPlan, activation_reserve_bytes, device_memory, plan_kv_cache
from asyncrl.rollout.prefill import PackedPrompts, PrefillPath, pack_prompts, prefill_path
from asyncrl.rollout.sampler import DeviceSampler, SamplingMode
from asyncrl.rollout.scheduler import StepPlan, StepResult
from asyncrl.rollout.settings import EngineSettings
from asyncrl.rollout.transfer import to_device


class StepRunner:
    """Owns the forward (fast or generic, see `build_forward`), the KV cache and the engine-wide sampling generator."""

    def __init__(self, model: nn.Module, settings: EngineSettings, version: int) -> None:
        self.model = model
        self.device = settings.device
        weights_on = next(model.parameters()).device
        if weights_on.type != self.device.type:
            raise ConfigError(f"the model is on {weights_on} but device={str(self.device)!r}; move the model")
        self.forward: StepForward
        self.forward, self.fast_path_problem = build_forward(model, settings.forward,
                                                             decode_attention=settings.decode_attention,
                                                             fused_decode=settings.fused_decode)
        self.cache: StepCache = self.forward.new_cache(settings.max_num_seqs, self.device)
        self.max_num_seqs = settings.max_num_seqs
        """Sequences a step may hold: fewer than asked when the sized GPU cache has fewer slots."""
        self.sampler = DeviceSampler(settings.max_num_seqs, self.device)
        self.prefill_path: PrefillPath = "padded"
        """How prefills run (`asyncrl.rollout.prefill.prefill_path`): packed but for float32 on CUDA."""
        if settings.packed_prefill and isinstance(self.forward, BatchedForward):
            assert isinstance(self.cache, SlotKVCache)
            self.prefill_path = prefill_path(self.device, self.cache.dtype)
        self.kv_plan: KVPlan | None = None
        self.bucketed_decode: BucketedDecode | None = None
        self.bucketed_prefill: BucketedPrefill | None = None
        if settings.cuda_graphs and isinstance(self.forward, BatchedForward):  # the generic path stays eager
            self._build_static(self.forward, settings)
        self.prefills: Counter[PrefillPath] = Counter()
        """Prefill forwards run, by path: what tests and benches read."""
        self.lock = threading.Lock()
        self.version = version
        self._results = _Results(settings.max_num_seqs, self.device)
        self._launched: _Launched | None = None
        self.read_late = self.device.type == "cuda"
        """Whether `run` returns the previous step's results (a GPU: overlap) or its own (the host)."""
        # the rows whose sampling settings the sampler holds, and their mode: most steps run the
        # last step's rows again, and then send positions only
        self._sampled_rows: tuple[object, ...] = ()
        self._mode = SamplingMode.of([])

    def _build_static(self, forward: BatchedForward, settings: EngineSettings) -> None:
        """`cuda_graphs`: a static cache (sized and allocated now on a GPU), the bucketed decode
        and, on the varlen path, the bucketed packed prefill; captured on CUDA, eager on the CPU."""
        assert isinstance(self.cache, SlotKVCache)
        self.cache.static = True
        capture = self.device.type == "cuda"
        self.kv_plan = self._allocate_static(forward, self.cache, settings)
        self.bucketed_decode = BucketedDecode(forward, self.cache, self.max_num_seqs, self.sampler, capture=capture)
        if self.prefill_path == "varlen":
            self.bucketed_prefill = BucketedPrefill(forward, self.cache, self.max_num_seqs,
                                                    settings.max_prefill_tokens, path="varlen", capture=capture)

    def _allocate_static(self, forward: BatchedForward, cache: SlotKVCache, settings: EngineSettings) -> KVPlan | None:
        """On a GPU: every slot that fits of `max_model_len` positions, allocated now. On the CPU
        (no device memory to read) None: the static cache grows with the longest row."""
        memory = device_memory(self.device)
        if memory is None:
            return None
        reserve = activation_reserve_bytes(forward.shape, max_num_seqs=self.max_num_seqs,
                                           max_model_len=settings.max_model_len,
                                           max_prefill_tokens=settings.max_prefill_tokens)
        plan = plan_kv_cache(memory, gpu_memory_utilization=settings.gpu_memory_utilization,
                             bytes_per_token=cache.bytes_per_token, max_model_len=settings.max_model_len,
                             max_num_seqs=self.max_num_seqs, reserve_bytes=reserve)
        cache.max_slots = self.max_num_seqs = plan.slots
        cache.allocate(plan.capacity)
        return plan

    @property
    def pending(self) -> StepPlan | None:
        """The plan whose step is queued and whose results `run` or `flush` has not returned yet."""
        return None if self._launched is None else self._launched.plan

    def run(self, plan: StepPlan) -> tuple[StepPlan, StepResult] | None:
        """Queue `plan`'s step, then return the previous step's plan and results (None when
        there was none): on a GPU the device runs `plan` while the host reads the last step.
        Without `read_late`, `plan`'s own results."""
        with self.lock, torch.inference_mode():
            previous, self._launched = self._launched, self._launch(plan)
        if not self.read_late:
            previous, self._launched = self._launched, None
        return None if previous is None else self._results.read(previous)

    def flush(self) -> tuple[StepPlan, StepResult] | None:
        """The last queued step's plan and results (None when none is queued)."""
        launched, self._launched = self._launched, None
        return None if launched is None else self._results.read(launched)

    def drop(self) -> None:
        """Forget the queued step (it failed, or the loop that planned it is gone)."""
        self._launched = None

    def _launch(self, plan: StepPlan) -> _Launched:
        """Moves, forwards and sampling of `plan`, then its results' copy to the host, all queued."""
        num_decode = len(plan.decode_positions)
        last_positions = [*plan.decode_positions, *(len(c) - 1 for c in plan.prefill_contexts)]
        # prefix-cache entries live in slots past the rows, moved there by this plan: room for
        # them first, and one position past the longest (padding rows of graph decode write the last)
        slots = max(plan.num_rows, plan.cache_slots)
        length = max(max(last_positions) + 1, plan.cache_len + (self.bucketed_decode is not None))
        if plan.cache_slots:
            self.cache.reserve(slots, length)
        self.cache.apply_moves(plan.moves)
        self.sampler.apply_moves(plan.moves)
        self.cache.reserve(slots, length)
        if plan.seqs != self._sampled_rows:  # Sequence compares by identity
            self._mode = self.sampler.set_rows(plan.keys, plan.params)
            self._sampled_rows = plan.seqs
        self.sampler.set_positions(last_positions)
        mode = self._mode
        sampled = None  # the step's (tokens, logprobs) when one call sampled every row
        if num_decode and self.bucketed_decode is not None:
            self.bucketed_decode(plan.decode_positions, mode)
        elif num_decode:
            sampled = self.sampler.sample_rows(self._decode(num_decode, max(plan.decode_positions) + 1), 0, mode)
        if plan.prefill_contexts:
            logits = self._prefill(plan.prefill_contexts, num_decode, plan.prefill_starts)
            prefilled = self.sampler.sample_rows(logits, num_decode, mode)
            sampled = None if num_decode else prefilled
        if sampled is None:
            sampled = self.sampler.tokens[: plan.num_rows], self.sampler.logprobs[: plan.num_rows]
        return self._results.copy(plan, self.version, *sampled)

    def _decode(self, rows: int, length: int) -> torch.Tensor:
        """Eager decode of rows 0..rows-1 from the sampler's tokens and positions, (rows, V) float32."""
        tokens, positions = self.sampler.tokens[:rows], self.sampler.positions(rows)
        if isinstance(self.forward, BatchedForward):  # the attended length from the host: no sync
            assert isinstance(self.cache, SlotKVCache)
            return self.forward.decode(self.cache, tokens, positions, length=length)
        return self.forward.decode(self.cache, tokens, positions)

    def _prefill(self, contexts: tuple[tuple[int, ...], ...], first_slot: int,
                 starts: tuple[int, ...] = ()) -> torch.Tensor:
        """Prefill rows into slots first_slot.. ; identical contexts (a GRPO group's n samples
        of one prompt) are computed once and their K/V copied: n x less prefill compute. A row
        with a start > 0 (a prefix-cache hit) computes its positions from there on."""
        unique: dict[tuple[int, ...], int] = {}
        source = [unique.setdefault(c, len(unique)) for c in contexts]
        # a hit's cached positions are in its own slot: rows are computed where they are then
        shared = len(unique) < len(contexts) and isinstance(self.cache, SlotKVCache) and not any(starts)
        rows = list(unique) if shared else list(contexts)
        if any(starts):
            logits = self._prefill_after(rows, first_slot, starts)
        else:
            self.prefills[self.prefill_path] += 1
            logits = self._prefill_padded(rows, first_slot) if self.prefill_path == "padded" else \
                self._prefill_packed(rows, first_slot)
        if not shared:
            return logits
        assert isinstance(self.cache, SlotKVCache)
        # unique rows sit at first_slot..; each other row takes its prompt's K/V, all in one copy
        moves = [(first_slot + row, first_slot + src) for row, src in enumerate(source) if row != src]
        self.cache.copy_slots([d for d, _ in moves], [s for _, s in moves], max(len(c) for c in rows))
        return logits[to_device(torch.tensor(source, dtype=torch.int64), self.device)]

    def _prefill_padded(self, rows: Sequence[tuple[int, ...]], first_slot: int) -> torch.Tensor:
        lengths = [len(c) for c in rows]
        padded = torch.zeros(len(rows), max(lengths), dtype=torch.int64)
        for row, context in enumerate(rows):
            padded[row, : len(context)] = torch.tensor(context, dtype=torch.int64)
        lens = to_device(torch.tensor(lengths, dtype=torch.int64), self.device)
        return self.forward.prefill(self.cache, to_device(padded, self.device), lens, first_slot)

    def _prefill_packed(self, rows: Sequence[tuple[int, ...]], first_slot: int) -> torch.Tensor:
        """Through the prefill graphs where there are, else eagerly, packed without padding."""
        if self.bucketed_prefill is not None:
            return self.bucketed_prefill(rows, first_slot)
        assert isinstance(self.forward, BatchedForward) and isinstance(self.cache, SlotKVCache)
        flat, lengths = pack_prompts(rows, first_slot)
        packed = PackedPrompts.view(to_device(flat, self.device), sum(lengths), len(rows), lengths, max(lengths))
        return self.forward.prefill_packed(self.cache, packed, self.prefill_path)

    def _prefill_after(self, rows: Sequence[tuple[int, ...]], first_slot: int, starts: Sequence[int]) -> torch.Tensor:
        """Rows whose slots hold their first starts[i] positions already (prefix-cache hits):
        only the rest is computed, at positions from the start on, eagerly (no graphs)."""
        assert isinstance(self.cache, SlotKVCache), "a prefix cache needs the slot KV cache"
        suffixes = [c[s:] for c, s in zip(rows, starts)]
        if isinstance(self.forward, BatchedForward):
            flat, lengths = pack_prompts(suffixes, first_slot, starts=starts)
            packed = PackedPrompts.view(to_device(flat, self.device), sum(lengths), len(rows), lengths, max(lengths))
            return self.forward.prefill_after(self.cache, packed, starts, first_slot)
        assert isinstance(self.forward, GenericForward)
        padded = torch.zeros(len(rows), max(len(c) for c in suffixes), dtype=torch.int64)
        for row, suffix in enumerate(suffixes):
            padded[row, : len(suffix)] = torch.tensor(suffix, dtype=torch.int64)
        lens = to_device(torch.tensor([len(c) for c in suffixes], dtype=torch.int64), self.device)
        return self.forward.prefill(self.cache, to_device(padded, self.device), lens, first_slot, starts=starts)

    @property
    def prefix_cacheable(self) -> bool:
        """Whether this forward's cache can keep and reuse prefixes: the slot KV cache (the
        generic path's per-row HF cache objects cannot)."""
        return isinstance(self.cache, SlotKVCache)

    def release_cache(self) -> None:
        with self.lock:
            self.cache.release()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Copy tensors into the model's parameters in place, between steps. Returns the count.

        Names are those of `model.named_parameters()` (tied aliases such as `lm_head.weight`
        are accepted too). Unknown names and shape mismatches raise `SyncError`. With the fused
        decode step the q/k/v and gate/up parameters are rows of its merged buffers
        (`asyncrl.rollout.merged`), so the trainer's separate projections land there, in place.
        """
        with self.lock:
            loaded = load_into(self.model, named_tensors)
            self.version = version
        return loaded


@dataclass(frozen=True)
class _Launched:
    """A queued step: its plan, the weights' version it ran under, where its results land."""

    plan: StepPlan
    version: int
    host: torch.Tensor  # (2, rows) float64 on the host: token ids, log-probs
    ready: torch.cuda.Event | None  # recorded after the copy (CUDA); None on the CPU


class _Results:
    """The one device-to-host copy of a step's results: token ids and log-probs as one float64
    (2, rows) tensor (float64 holds both exactly).

    On CUDA it goes into one of two pinned host buffers, used in turn, non-blocking, and an
    event marks its end, so reading a step's results waits for that step only, not for the one
    queued after it. On the CPU the stacked tensor is the host copy already.
    """

    def __init__(self, max_rows: int, device: torch.device) -> None:
        cuda = device.type == "cuda"
        # flat, so that the first 2 * rows elements are a contiguous (2, rows): an asynchronous copy
        self._pinned = [torch.zeros(2 * max_rows, dtype=torch.float64, device="cpu", pin_memory=True)
                        for _ in range(2)] if cuda else None
        self._turn = 0

    def copy(self, plan: StepPlan, version: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> _Launched:
        """Queue the copy of the step's `tokens` and `logprobs` (rows,)."""
        rows = plan.num_rows
        both = torch.stack((tokens.double(), logprobs.double()))
        if self._pinned is None:
            return _Launched(plan, version, both, None)
        host = self._pinned[self._turn][: 2 * rows].view(2, rows)
        self._turn ^= 1
        host.copy_(both, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return _Launched(plan, version, host, ready)

    @staticmethod
    def read(launched: _Launched) -> tuple[StepPlan, StepResult]:
        """Wait for the step's copy (not for later steps) and read it: the step's one host read."""
        if launched.ready is not None:
            launched.ready.synchronize()
        ids, logprobs = launched.host.tolist()
        return launched.plan, StepResult([int(t) for t in ids], logprobs, launched.version)
