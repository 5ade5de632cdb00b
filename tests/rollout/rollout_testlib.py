"""Tiny random-init models and reference computations shared by the rollout tests."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PretrainedConfig

from asyncrl.config.schema import RolloutConfig
from asyncrl.rollout import EngineSettings, TorchEngine, engine_settings
from asyncrl.types import GenerationRequest, SamplingParams, Trajectory

VOCAB = 64
EOS = 0

torch.set_num_threads(1)


FAST_ARCHS = ("llama", "qwen2", "qwen3", "llama3")
GENERIC_ARCHS = ("gpt2", "gpt_neox", "opt", "gemma2")
"""gemma2 has sliding-window layers, so it runs one row at a time; the others batch."""

_GQA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128)
# Llama 3.1's rope scaling with a small original context, so that scaled and unscaled
# frequencies differ in this model's head_dim.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
_NO_SPECIALS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
_CONFIGS: dict[str, tuple[str, dict[str, object]]] = {
    "llama": ("LlamaConfig", _GQA),
    "qwen2": ("Qwen2Config", _GQA),
    "qwen3": ("Qwen3Config", {**_GQA, "head_dim": 32}),  # head_dim != hidden/heads, as in Qwen3
    "llama3": ("LlamaConfig", {**_GQA, "rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, **_NO_SPECIALS)),
    "gpt_neox": ("GPTNeoXConfig", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, **_NO_SPECIALS)),
    "opt": ("OPTConfig", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, ffn_dim=64, word_embed_proj_dim=32, **_NO_SPECIALS)),
    "gemma2": ("Gemma2Config", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                    intermediate_size=64, sliding_window=4, **_NO_SPECIALS)),
}


def tiny_config(arch: str) -> PretrainedConfig:
    """The config of a 2-layer random model of `arch` (one of FAST_ARCHS + GENERIC_ARCHS)."""
    name, kwargs = _CONFIGS[arch]
    config: PretrainedConfig = getattr(transformers, name)(**kwargs)
    return config


def tiny_model(arch: str = "llama", seed: int = 0) -> torch.nn.Module:
    """A 2-layer model of `arch` (grouped-query attention where the architecture has it), random
    weights from `seed`."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(arch)).eval()


def prompt(length: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1, VOCAB, (length,), generator=g).tolist())


def request(
    rid: str, prompt_ids: tuple[int, ...], max_tokens: int, temperature: float = 0.0, **kw: object
) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, **kw)
    return GenerationRequest(rid, prompt_ids, params)


def staggered_requests(n: int, temperature: float = 0.0) -> list[GenerationRequest]:
    """Prompts of 3..10 tokens, max_tokens 4..~30: sequences finish at different steps."""
    return [
        request(f"r{i}", prompt(3 + (i * 5) % 8, seed=i), 4 + (i * 7) % 27, temperature)
        for i in range(n)
    ]


def mixed_requests(staggered: int, first_tokens: int, step_tokens: int) -> list[GenerationRequest]:
    """`staggered` rows at T=0.8 (staggered lengths, so rows finish and slots move) and three seeded
    rows with top-k and top-p: every sampling mode but greedy-only in one batch."""
    filtered = [GenerationRequest(f"f{i}", prompt(4 + i, seed=20 + i),
                                  SamplingParams(max_tokens=first_tokens + step_tokens * i, temperature=0.9,
                                                 top_k=5 + i, top_p=0.8 if i else 1.0, seed=i, ignore_eos=True))
                for i in range(3)]
    return staggered_requests(staggered, temperature=0.8) + filtered


def settings_of(**fields: Any) -> EngineSettings:
    """`engine_settings` as the registry builds it: the `rollout.*` keys among `fields` go into a
    `RolloutConfig`, the rest (device, seed, max_model_len, forward, ...) are its arguments, but
    for `cuda_graphs` and `prefix_cache`, set on the resolved value: cuda_graphs=True on the CPU
    runs the fixed-shape decode eagerly (what CUDA captures), prefix_cache without a multi-turn
    config."""
    forced = {name: fields.pop(name) for name in ("cuda_graphs", "prefix_cache") if name in fields}
    keys = {f.name for f in dataclasses.fields(RolloutConfig)}
    rollout = RolloutConfig(**{name: fields.pop(name) for name in list(fields) if name in keys})
    return dataclasses.replace(engine_settings(rollout, **fields), **forced)


def engine(model: torch.nn.Module, version: int = 0, **settings: Any) -> TorchEngine:
    return TorchEngine(model, EOS, settings_of(**settings), version=version)


def run(fn: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(fn())


def one_at_a_time(model: torch.nn.Module, reqs: list[GenerationRequest]) -> list[Trajectory]:
    """Reference: each request alone in a fresh engine."""
    outs = []
    for r in reqs:
        eng = engine(model)
        outs.append(asyncio.run(eng.generate(r)))
        eng.close()
    return outs


def teacher_forced_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], response_ids: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of the HF model at each response token, (len(response),)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response_ids)[:, None]).squeeze(1)


async def wait_for_tokens(eng: TorchEngine, count: int, timeout_s: float = 10.0) -> None:
    """Yield to the engine until it has generated at least `count` tokens."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while eng.stats().generated_tokens < count:
        assert loop.time() < deadline, "engine made no progress"
        await asyncio.sleep(0.0005)
