"""The step thread's side of the engine: run one `StepPlan` on the model, swap weights safely.

`StepRunner.run` applies the plan's slot moves, sizes the KV cache, runs the batched decode and
prefill forwards, samples, and returns plain Python lists. It holds `lock` for the whole step;
`load_weights` takes the same lock, so weights change only between steps whichever thread calls
it. On CUDA with static decode the KV cache is sized from the device's memory and allocated when
the runner is built (`asyncrl.rollout.memory`); `max_num_seqs` then says how many sequences fit.
A step's inputs go to the device without waiting for it (`asyncrl.rollout.transfer`) and its
results come back in one device-to-host copy, the step's only synchronisation.
This module does no scheduling and knows nothing about asyncio or futures.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from asyncrl.config.names import DecodeAttention, FusedDecode, PackedPrefill
from asyncrl.errors import ConfigError
from asyncrl.models.weights import load_into
from asyncrl.rollout.attention import resolve
from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.generic import StepCache, StepForward, build_forward
from asyncrl.rollout.graphs import BucketedDecode, BucketedPrefill
from asyncrl.rollout.kernels import use_fused_decode
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.memory import KVPlan, ModelShape, activation_reserve_bytes, device_memory, plan_kv_cache
from asyncrl.rollout.prefill import PackedPrompts, PrefillPath, pack_prompts, prefill_path
from asyncrl.rollout.sampler import SamplingBatch, sample
from asyncrl.rollout.scheduler import StepPlan, StepResult
from asyncrl.rollout.settings import ForwardChoice
from asyncrl.rollout.transfer import to_device


class StepRunner:
    """Owns the forward (fast or generic, see `build_forward`), the KV cache and the engine-wide sampling generator."""

    def __init__(
        self,
        model: nn.Module,
        *,
        max_num_seqs: int,
        device: torch.device | str,
        version: int,
        seed: int | None,
        forward: ForwardChoice = "auto",
        static_decode: bool = False,
        max_model_len: int = 32768,
        gpu_memory_utilization: float = 0.5,
        max_prefill_tokens: int = 4096,
        decode_attention: DecodeAttention = "auto",
        fused_decode: FusedDecode = "auto",
        packed_prefill: PackedPrefill = "auto",
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        weights_on = next(model.parameters()).device
        if weights_on.type != self.device.type:
            raise ConfigError(f"the model is on {weights_on} but device={device!r}; move the model")
        self.forward: StepForward
        self.forward, self.fast_path_problem = build_forward(model, forward,
                                                             attention=resolve(decode_attention, self.device),
                                                             fused=use_fused_decode(fused_decode, self.device))
        self.cache: StepCache = self.forward.new_cache(max_num_seqs, self.device)
        self.max_num_seqs = max_num_seqs
        """Sequences a step may hold: fewer than asked when the sized GPU cache has fewer slots."""
        self.kv_plan: KVPlan | None = None
        self.graphs: BucketedDecode | None = None
        if static_decode and isinstance(self.forward, BatchedForward):  # the generic path stays eager
            assert isinstance(self.cache, SlotKVCache)
            self.cache.static = True
            self.kv_plan = self._allocate_static(self.forward, self.cache, max_model_len,
                                                 gpu_memory_utilization, max_prefill_tokens)
            self.graphs = BucketedDecode(self.forward, self.cache, self.max_num_seqs,
                                         capture=self.device.type == "cuda")
        self.prefill_path: PrefillPath = "padded"
        """How prefills run (`asyncrl.rollout.prefill.prefill_path`): packed but for float32 on CUDA."""
        self.prefill_graphs: BucketedPrefill | None = None
        if isinstance(self.forward, BatchedForward):
            assert isinstance(self.cache, SlotKVCache)
            self.prefill_path = prefill_path(self.device, self.cache.dtype) if packed_prefill == "auto" \
                else "padded"
            if self.graphs is not None and self.prefill_path == "varlen":
                self.prefill_graphs = BucketedPrefill(self.forward, self.cache, self.max_num_seqs, max_prefill_tokens,
                                                      path="varlen", capture=self.device.type == "cuda")
        self.prefills: Counter[PrefillPath] = Counter()
        """Prefill forwards run, by path: what tests and benches read."""
        self.lock = threading.Lock()
        self.version = version
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def _allocate_static(self, forward: BatchedForward, cache: SlotKVCache, max_model_len: int,
                         fraction: float, max_prefill_tokens: int) -> KVPlan | None:
        """On a GPU: every slot that fits of `max_model_len` positions, allocated now. On the CPU
        (no device memory to read) None: the static cache grows with the longest row."""
        memory = device_memory(self.device)
        if memory is None:
            return None
        shape = ModelShape(forward.vocab_size, forward.hidden_size, forward.intermediate_size,
                           forward.num_heads, forward.kv_heads, forward.head_dim)
        reserve = activation_reserve_bytes(shape, max_num_seqs=self.max_num_seqs, max_model_len=max_model_len,
                                           max_prefill_tokens=max_prefill_tokens)
        plan = plan_kv_cache(memory, fraction=fraction, bytes_per_token=cache.bytes_per_token,
                             max_model_len=max_model_len, max_num_seqs=self.max_num_seqs, reserve_bytes=reserve)
        cache.max_slots = self.max_num_seqs = plan.slots
        cache.allocate(plan.capacity)
        return plan

    def run(self, plan: StepPlan) -> StepResult:
        with self.lock, torch.inference_mode():
            self.cache.apply_moves(plan.moves)
            logits = self._logits(plan)
            batch = SamplingBatch.build(list(plan.params), list(plan.generators), logits.device)
            tokens, logprobs = sample(logits, batch, self.generator)
            # One device-to-host copy per step: float64 holds token ids and float32 values exactly.
            ids, lps = torch.stack((tokens.to(torch.float64), logprobs.to(torch.float64))).tolist()
            return StepResult([int(t) for t in ids], lps, self.version)

    def _logits(self, plan: StepPlan) -> torch.Tensor:
        """Decode rows then prefill rows, (rows, V) float32."""
        num_decode = len(plan.decode_tokens)
        lengths = [len(c) for c in plan.prefill_contexts]
        need = max([p + 1 for p in plan.decode_positions] + lengths)
        self.cache.reserve(plan.num_rows, need)
        parts: list[torch.Tensor] = []
        if num_decode and self.graphs is not None:
            parts.append(self.graphs(plan.decode_tokens, plan.decode_positions))
        elif num_decode:
            host = torch.tensor((plan.decode_tokens, plan.decode_positions), dtype=torch.int64)
            tokens, positions = to_device(host, self.device)
            if isinstance(self.forward, BatchedForward):  # the attended length from the host: no sync
                assert isinstance(self.cache, SlotKVCache)
                length = max(plan.decode_positions) + 1
                parts.append(self.forward.decode(self.cache, tokens, positions, length=length))
            else:
                parts.append(self.forward.decode(self.cache, tokens, positions))
        if lengths:
            parts.append(self._prefill(plan.prefill_contexts, num_decode))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _prefill(self, contexts: tuple[tuple[int, ...], ...], first_slot: int) -> torch.Tensor:
        """Prefill rows into slots first_slot.. ; identical contexts (a GRPO group's n samples
        of one prompt) are computed once and their K/V copied: n x less prefill compute."""
        unique: dict[tuple[int, ...], int] = {}
        source = [unique.setdefault(c, len(unique)) for c in contexts]
        shared = len(unique) < len(contexts) and isinstance(self.cache, SlotKVCache)
        rows = list(unique) if shared else list(contexts)
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
        if self.prefill_graphs is not None:
            return self.prefill_graphs(rows, first_slot)
        assert isinstance(self.forward, BatchedForward) and isinstance(self.cache, SlotKVCache)
        flat, lengths = pack_prompts(rows, first_slot)
        packed = PackedPrompts.view(to_device(flat, self.device), sum(lengths), len(rows), lengths, max(lengths))
        return self.forward.prefill_packed(self.cache, packed, self.prefill_path)

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
