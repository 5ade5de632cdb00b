"""Mixed precision on CUDA (skipped without a GPU): `model.mixed_precision=auto` takes the
bf16-parameter path there (the plan's start line and the actor agree), and a Qwen2-0.5B-shaped
update on it peaks lower than the same update under autocast, its activations within the memory
model's bytes per token for that path (`scheduling.micro_budget.load_bytes_per_token`)."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.config import load_config
from asyncrl.config.schema import ActorConfig
from asyncrl.scheduling.micro_budget import ModelShape, TrainerLoad, load_bytes_per_token
from asyncrl.scheduling.plan import plan_run
from asyncrl.training.actor import Actor
from asyncrl.training.precision import MasterWeights
from tests.training.helpers import groups_of_lengths, tiny_lm
from tests.training.test_actor import prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
BF16 = torch.bfloat16
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
TOKENS = 8 * 512  # 8 rows of 64 + 448 tokens, one micro-batch
CFG = ActorConfig(ppo_micro_batch_tokens=TOKENS, log_prob_micro_batch_tokens=TOKENS, lr=1e-6, warmup_steps=0)


def test_auto_takes_the_bf16_parameter_path_on_cuda():
    assert plan_run(load_config(None, ["trainer.device=cuda", "model.dtype=bfloat16"])).precision == "param_dtype"
    model = tiny_lm().cuda()
    actor = Actor(model, CFG, temperature=1.0, norm_length=4, compute_dtype=BF16)
    assert actor.precision.path == "param_dtype" and isinstance(actor.weights, MasterWeights)
    assert all(p.dtype == BF16 and p.is_cuda for p in model.parameters())
    actor.train_step(prepared_batch(model, groups_of_lengths([4, 6], [[3, 5], [2, 7]]), actor), num_mini_batches=1)
    assert all(m.dtype == torch.float32 and m.is_cuda for m in actor.weights.masters)
    assert all(s["exp_avg"].dtype == torch.float32 for s in actor.optimizer.state.values())


def update_peak(path: str) -> tuple[int, int, ModelShape]:
    """(peak bytes of a warm update, of which above what the actor holds between steps, shape)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B))
    shape = ModelShape.from_hf(model.config)
    assert shape is not None
    actor = Actor(model, CFG, temperature=1.0, norm_length=448, compute_dtype=BF16, mixed_precision=path)
    batch = prepared_batch(model, groups_of_lengths([64, 64], [[448] * 4, [448] * 4]), actor)
    actor.train_step(batch, num_mini_batches=1)  # the optimizer's state exists from here on
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    actor.train_step(batch, num_mini_batches=1)
    peak = torch.cuda.max_memory_allocated()
    del actor, model, batch
    gc.collect()
    torch.cuda.empty_cache()
    return peak, peak - held, shape


def test_bf16_parameters_peak_lower_than_autocast_and_within_the_memory_model():
    autocast_peak, _, _ = update_peak("autocast")
    peak, activations, shape = update_peak("param_dtype")
    assert peak < autocast_peak, f"param_dtype {peak / 2**30:.2f} GiB, autocast {autocast_peak / 2**30:.2f} GiB"
    load = TrainerLoad(compute_bytes=2, precision="param_dtype", chunked_head=True)
    assert activations <= TOKENS * load_bytes_per_token(shape, load, TOKENS), f"{activations / TOKENS:.0f} B per token"
