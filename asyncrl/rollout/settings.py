"""How a `TorchEngine` runs, as one frozen value: cache and batch sizes, device, sampling seed,
forward path. Built from `rollout.*` by the engine registry (`asyncrl.rollout.registry`), or
directly by tests and benchmarks; a value out of range is a `ConfigError` on construction, so an
engine never sees one.

Not here: what an engine runs (the model, its EOS ids), the thread it runs on, or its state (the
weight version it starts at); those are the engine's own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from asyncrl.config.names import DecodeAttention, FusedDecode, PackedPrefill
from asyncrl.errors import ConfigError

ForwardChoice = Literal["auto", "generic"]

CUDA_ADMIT_DIVISOR = 8
"""CUDA, `admit_min_free_slots` 0: admit once an eighth of `max_num_seqs` slots are free. Chosen
by replaying the scheduler on the GPU benchmark's request set under issue 24's cost model (the
best k was about max_num_seqs / 8 at batch 16 to 128; docs/engine.md); awaits a GPU measurement."""


@dataclass(frozen=True)
class EngineSettings:
    kv_budget_tokens: int = 32768
    """Tokens of KV cache over all running sequences (rollout.kv_budget_tokens)."""
    max_num_seqs: int = 64
    """Sequences decoded at once (rollout.max_num_seqs)."""
    max_prefill_tokens: int = 4096
    """Prompt tokens admitted into one step's prefill."""
    max_model_len: int | None = None
    """Longest prompt + response a request may have; None: kv_budget_tokens (never more)."""
    gpu_memory_utilization: float = 0.5
    """Share of the GPU's memory the KV cache may fill (rollout.gpu_memory_utilization)."""
    device: str = "cpu"
    """Where the model runs ("cpu", "cuda", "cuda:1")."""
    seed: int | None = None
    """Seed of the sampling generator for requests without their own seed; None: a random one."""
    forward: ForwardChoice = "auto"
    """"auto": the fast forward for the architectures it knows, else HF's; "generic": always HF's."""
    static_decode: bool | None = None
    """Decode at fixed shapes (CUDA graphs on a GPU); None: on CUDA devices only."""
    num_threads: int | None = None
    """Torch threads of the engine's own step thread when it is given none; None: torch's count."""
    decode_attention: DecodeAttention = "auto"
    """Decode attention path (rollout.decode_attention; `asyncrl.rollout.attention.resolve`)."""
    fused_decode: FusedDecode = "auto"
    """Fused decode step (rollout.fused_decode; `asyncrl.rollout.kernels.use_fused_decode`)."""
    packed_prefill: PackedPrefill = "auto"
    """Packed prefill (rollout.packed_prefill; `asyncrl.rollout.prefill.prefill_path`); "off": padded."""
    admit_min_free_slots: int = 0
    """Admit when min(this, waiting requests) slots are free or nothing runs; 0: `admit_free_slots`
    picks it (rollout.admit_min_free_slots)."""
    prefix_cache: bool = False
    """Keep finished sequences' K/V in free slots and prefill a prompt that starts with one only
    past it (`asyncrl.rollout.prefix_cache`); on when rollout.multi_turn.enable (a turn's prompt is
    the conversation so far), off for single-turn runs, which it would not speed up."""

    def __post_init__(self) -> None:
        for key, value in (("kv_budget_tokens", self.kv_budget_tokens), ("max_num_seqs", self.max_num_seqs),
                           ("max_prefill_tokens", self.max_prefill_tokens), ("max_model_len", self.model_len)):
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        if self.admit_min_free_slots < 0:
            raise ConfigError(f"admit_min_free_slots must be >= 0 (0: auto), got {self.admit_min_free_slots}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")

    @property
    def model_len(self) -> int:
        """`max_model_len` resolved: at most the KV budget (one sequence cannot hold more)."""
        return self.kv_budget_tokens if self.max_model_len is None else min(self.max_model_len, self.kv_budget_tokens)

    @property
    def admit_free_slots(self) -> int:
        """`admit_min_free_slots` resolved, at most `max_num_seqs`: 0 is 1 on the CPU (a prefill
        there costs about its tokens, so waiting buys nothing) and max_num_seqs / 8 on CUDA (a
        prefill step is launch-bound and stalls every running row)."""
        k = self.admit_min_free_slots
        if k == 0:
            k = max(1, self.max_num_seqs // CUDA_ADMIT_DIVISOR) if torch.device(self.device).type == "cuda" else 1
        return min(k, self.max_num_seqs)

    @property
    def decode_graphs(self) -> bool:
        """`static_decode` resolved: fixed-shape decode where CUDA graphs pay, on GPUs."""
        return torch.device(self.device).type == "cuda" if self.static_decode is None else self.static_decode
