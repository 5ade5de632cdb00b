"""Micro-batch budgets: the memory model against hand-computed numbers (Qwen2-0.5B's shape), the
derived budget on CUDA, and the plan's precedence (our key, else derived; forward-only twice the
training budget). Integers throughout, so the checks are exact."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from asyncrl.config import load_config
from asyncrl.scheduling.micro_budget import (
    GiB,
    ModelShape,
    TrainerDevice,
    TrainerLoad,
    activation_bytes_per_token,
    cuda_micro_batch_tokens,
    micro_batch_budgets,
    model_state_bytes,
)
from asyncrl.scheduling.plan import plan_run

QWEN2_05B = ModelShape(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                       head_dim=64, vocab_size=151936, tied_embeddings=True)
H100 = TrainerDevice(80 * GiB, QWEN2_05B)


def test_the_shape_comes_from_a_transformers_config():
    config = SimpleNamespace(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    assert ModelShape.from_hf(config) == QWEN2_05B  # head_dim = 896 / 14
    assert ModelShape.from_hf(SimpleNamespace(hidden_size=896)) is None


def test_parameters_of_qwen2_05b():
    # per layer: 896 x (2 x 896 + 2 x 128) attention + 3 x 896 x 4864 MLP = 14,909,440; x 24; + 151,936 x 896
    assert QWEN2_05B.params == 24 * 14_909_440 + 136_134_656 == 493_961_216
    # LoRA rank 8 on every linear: 8 x 24 x (2 x 1792 + 2 x 1024 + 3 x 5760)
    assert QWEN2_05B.lora_params(8) == 8 * 24 * 22_912


def test_activation_bytes_per_token_by_hand():
    # norm 896 x (4 + 4 + 2) = 8,960; attention 2 x (4 x 896 + 4 x 128) = 8,192; MLP 4 x 2 x 4864 = 38,912
    layer = 2 * 8_960 + 8_192 + 38_912
    head = 8_960 + 3 * 151_936 * 2
    assert activation_bytes_per_token(QWEN2_05B, compute_bytes=2, checkpointing=False) == 25 * layer + head \
        == 2_546_176
    assert activation_bytes_per_token(QWEN2_05B, compute_bytes=2, checkpointing=True) == \
        24 * 896 * 4 + 2 * layer + head == 1_136_640
    # a head over a chunk of 8192 columns instead of the vocabulary
    assert activation_bytes_per_token(QWEN2_05B, compute_bytes=2, checkpointing=False, head_columns=8192) == \
        25 * layer + 8_960 + 3 * 8192 * 2


def test_model_state_bytes_by_hand():
    p = 493_961_216
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=2)) == 18 * p == 8_891_301_888
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=4, reference=True, critic=True, ranks=2)) == \
        (16 + 4 + 16) * p // 2
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=2, lora_rank=8)) == \
        4 * p + 16 * QWEN2_05B.lora_params(8) + 2 * p


@pytest.mark.parametrize("share, checkpointing, tokens", [
    (0.5, False, 9216),  # (40 GiB - 8,891,301,888 - 2 GiB) x 0.8 / 2,546,176 = 10,026
    (0.5, True, 21504),  # ... / 1,136,640 = 22,459
    (0.0, False, 22528),  # (80 GiB - ...) x 0.8 / 2,546,176 = 23,520
    (0.95, False, 1024),  # nothing left: one row at a time, at least one rounding unit
])
def test_the_cuda_budget_by_hand(share, checkpointing, tokens):
    assert cuda_micro_batch_tokens(H100, share, TrainerLoad(compute_bytes=2, checkpointing=checkpointing)) == tokens


def test_budgets_precedence():
    assert micro_batch_budgets(0, 0, 9216) == (9216, 18432)
    assert micro_batch_budgets(4096, 0, 9216) == (4096, 8192)
    assert micro_batch_budgets(0, 5000, 9216) == (9216, 5000)


@pytest.mark.parametrize("overrides, device, budgets, basis", [
    ([], "cpu", (8192, 16384), "default"),
    (["actor.ppo_micro_batch_tokens=4096"], "cpu", (4096, 8192), "set"),
    (["actor.log_prob_micro_batch_tokens=1000"], "cpu", (8192, 1000), "default"),
    (["trainer.device=cuda", "model.dtype=bfloat16"], None, (9216, 18432), "sized: 40.0 GiB left to the trainer"),
    (["trainer.device=cuda", "model.dtype=bfloat16", "pipeline=one_step_off"], None, (9216, 18432), "sized: 40.0"),
    (["trainer.device=cuda", "model.dtype=bfloat16", "pipeline=one_step_off", "backend=ray"], None, (22528, 45056),
     "sized: 80.0 GiB"),  # Ray gives each side of a decoupled run its own GPUs
    (["trainer.device=cuda", "model.dtype=bfloat16", "model.enable_gradient_checkpointing=true"], None,
     (21504, 43008), "sized"),
    (["trainer.device=cuda", "actor.ppo_micro_batch_tokens=2048"], None, (2048, 4096), "set"),
])
def test_the_plan_holds_the_resolved_budgets(overrides, device, budgets, basis):
    plan = plan_run(load_config(None, overrides), device, H100)
    assert (plan.micro_batch_tokens, plan.log_prob_micro_batch_tokens) == budgets
    assert plan.micro_batch_basis.startswith(basis)
    assert f"micro-batches of {budgets[0]} tokens ({plan.micro_batch_basis}), {budgets[1]} forward-only" in plan.line()


def test_cuda_without_the_device_or_the_shape_keeps_the_cpu_budget():
    plan = plan_run(load_config(None, ["trainer.device=cuda"]))
    assert (plan.micro_batch_tokens, plan.log_prob_micro_batch_tokens) == (8192, 16384)
    assert "unknown" in plan.micro_batch_basis


def test_the_factory_hands_the_plans_budgets_to_actor_reference_and_critic(tiny_cache):
    from asyncrl.workers.factory import build_trainer_side

    cfg = load_config(None, ["actor.ppo_micro_batch_tokens=3000", "algorithm.adv_estimator=gae",
                             "actor.use_kl_loss=true"])
    trainer = build_trainer_side(cfg, plan_run(cfg))
    assert (trainer.actor.cfg.ppo_micro_batch_tokens, trainer.actor.cfg.log_prob_micro_batch_tokens) == (3000, 6000)
    assert trainer.ref.micro_batch_tokens == 6000
    assert (trainer.critic.micro_batch_tokens, trainer.critic.forward_micro_batch_tokens) == (3000, 6000)
