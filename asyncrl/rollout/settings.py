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

from asyncrl.errors import ConfigError

ForwardChoice = Literal["auto", "generic"]


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

    def __post_init__(self) -> None:
        for key, value in (("kv_budget_tokens", self.kv_budget_tokens), ("max_num_seqs", self.max_num_seqs),
                           ("max_prefill_tokens", self.max_prefill_tokens), ("max_model_len", self.model_len)):
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")

    @property
    def model_len(self) -> int:
        """`max_model_len` resolved: at most the KV budget (one sequence cannot hold more)."""
        return self.kv_budget_tokens if self.max_model_len is None else min(self.max_model_len, self.kv_budget_tokens)

    @property
    def decode_graphs(self) -> bool:
        """`static_decode` resolved: fixed-shape decode where CUDA graphs pay, on GPUs."""
        return torch.device(self.device).type == "cuda" if self.static_decode is None else self.static_decode
