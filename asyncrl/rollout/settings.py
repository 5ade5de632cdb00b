"""How a `TorchEngine` runs: its `rollout.*` keys, resolved once for one device by
`engine_settings`, the one place where an `auto` value or a device-dependent default is decided.

A field read from a key has the key's name all the way down (`rollout.cuda_graphs` is
`EngineSettings.cuda_graphs` in the engine, the runner and the graphs' docs); its default and its
range are the config's alone (`RolloutConfig`, checked by `asyncrl.config.validate.check_fields`),
so tests and benchmarks build settings the same way the registry does, from a `RolloutConfig`.
`prefix_cache` is the one field derived rather than read: a multi-turn run
(`rollout.multi_turn.enable`) keeps finished turns' K/V.

Not here: what an engine runs (the model, its EOS ids), the thread it runs on, or its state (the
weight version it starts at); those are the engine's own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from asyncrl.config.schema import RolloutConfig
from asyncrl.config.validate import check_fields
from asyncrl.errors import ConfigError
from asyncrl.rollout.attention import DecodeAttentionPath, resolve
from asyncrl.rollout.kernels import use_fused_decode

ForwardChoice = Literal["auto", "generic"]

CUDA_ADMIT_DIVISOR = 8
"""CUDA, `admit_min_free_slots` 0: admit once an eighth of `max_num_seqs` slots are free. Chosen
by replaying the scheduler on the GPU benchmark's request set under issue 24's cost model (the
best k was about max_num_seqs / 8 at batch 16 to 128; docs/engine.md); awaits a GPU measurement."""
MAX_PREFILL_TOKENS = 4096
"""Prompt tokens admitted into one step's prefill (no key: one admission is allowed however long)."""


@dataclass(frozen=True)
class EngineSettings:
    """`rollout.*` resolved for one device (built by `engine_settings`; no defaults of its own)."""

    kv_budget_tokens: int
    """rollout.kv_budget_tokens: tokens of KV cache over all running sequences."""
    max_num_seqs: int
    """rollout.max_num_seqs: sequences decoded at once (a sized GPU cache may hold fewer)."""
    gpu_memory_utilization: float
    """rollout.gpu_memory_utilization: share of the GPU's memory the engine may fill."""
    cuda_graphs: bool
    """rollout.cuda_graphs on a CUDA device: decode at fixed shapes over a static cache, replayed
    from CUDA graphs. Set True on the CPU (tests) the same code runs eagerly."""
    decode_attention: DecodeAttentionPath
    """rollout.decode_attention resolved (`asyncrl.rollout.attention.resolve`)."""
    fused_decode: bool
    """rollout.fused_decode resolved (`asyncrl.rollout.kernels.use_fused_decode`)."""
    packed_prefill: bool
    """rollout.packed_prefill: True (auto) prefills packed where the device and dtype have a path
    (`asyncrl.rollout.prefill.prefill_path`); False (off) padded."""
    admit_min_free_slots: int
    """rollout.admit_min_free_slots resolved, 1..max_num_seqs: admit when min(this, waiting
    requests) slots are free or nothing runs; 0 there is 1 on the CPU (a prefill costs about its
    tokens, so waiting buys nothing) and max_num_seqs / 8 on CUDA (a prefill step is launch-bound
    and stalls every running row)."""
    prefix_cache: bool
    """rollout.multi_turn.enable: keep finished sequences' K/V in free slots and prefill a prompt
    that starts with one only past it (`asyncrl.rollout.prefix_cache`); a turn's prompt is the
    conversation so far, which single-turn runs would not speed up."""
    max_model_len: int
    """Longest prompt + response a request may have, at most kv_budget_tokens (sizes a GPU's cache)."""
    device: torch.device
    """Where the model runs."""
    seed: int | None
    """Seed of the sampling generator for requests without their own seed; None: a random one."""
    max_prefill_tokens: int
    """Prompt tokens admitted into one step's prefill."""
    forward: ForwardChoice
    """"auto": the fast forward for the architectures it knows, else HF's; "generic": always HF's."""
    num_threads: int | None
    """Torch threads of the engine's own step thread when it is given none; None: torch's count."""


def engine_settings(rollout: RolloutConfig | None = None, *, device: str | torch.device = "cpu",
                    seed: int | None = None, max_model_len: int | None = None,
                    max_prefill_tokens: int = MAX_PREFILL_TOKENS, forward: ForwardChoice = "auto",
                    num_threads: int | None = None) -> EngineSettings:
    """`rollout` (default: the config's defaults) checked and resolved on `device`; each key read
    once. `max_model_len`: the longest prompt + response the run asks for; None:
    rollout.kv_budget_tokens. A value out of range is a `ConfigError` naming its key."""
    cfg = RolloutConfig() if rollout is None else rollout
    check_fields(cfg, "rollout.")
    for name, value in (("max_model_len", max_model_len), ("max_prefill_tokens", max_prefill_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    where = torch.device(device)
    cuda = where.type == "cuda"
    budget, rows = cfg.kv_budget_tokens, cfg.max_num_seqs
    admit = cfg.admit_min_free_slots or (max(1, rows // CUDA_ADMIT_DIVISOR) if cuda else 1)
    return EngineSettings(
        kv_budget_tokens=budget, max_num_seqs=rows, gpu_memory_utilization=cfg.gpu_memory_utilization,
        cuda_graphs=cfg.cuda_graphs and cuda, decode_attention=resolve(cfg.decode_attention, where),
        fused_decode=use_fused_decode(cfg.fused_decode, where), packed_prefill=cfg.packed_prefill == "auto",
        admit_min_free_slots=min(admit, rows), prefix_cache=cfg.multi_turn.enable,
        max_model_len=budget if max_model_len is None else min(max_model_len, budget), device=where, seed=seed,
        max_prefill_tokens=max_prefill_tokens, forward=forward, num_threads=num_threads)
