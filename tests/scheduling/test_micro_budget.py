"""Micro-batch budgets: the memory model against hand-computed numbers (Qwen2-0.5B's shape), the
derived budget on CUDA (the precision path and the head over vocabulary chunks as the plan
resolves them), and the plan's precedence (our key, else derived; forward-only twice the
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
    chunk_size,
    cuda_micro_batch_tokens,
    load_bytes_per_token,
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
    # the same bytes on the bf16-parameter path (working copy for casts); its reference is bf16 alone
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=2, precision="param_dtype")) == 18 * p
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=2, precision="param_dtype", reference=True)) == \
        (16 + 2) * p + 2 * p
    assert model_state_bytes(QWEN2_05B, TrainerLoad(compute_bytes=2, reference=True)) == (16 + 4) * p + 2 * p


def test_the_chunk_width_and_the_bytes_per_token_of_each_path_by_hand():
    # 16,543 tokens: 512 MiB / (3 x 16,543 x 4) = 2,704.4 rows -> 2,688 (a multiple of 128)
    assert chunk_size(16_543, 151_936, 512 << 20) == 2_688
    assert chunk_size(512, 151_936, 16 << 20) == 2_688  # 16 MiB / (3 x 512 x 4) = 2,730
    # param_dtype: bf16 residual, norm 896 x (2 + 4 + 2) = 7,168; a layer 2 x 7,168 + 8,192 + 38,912 = 61,440
    bf16 = TrainerLoad(compute_bytes=2, precision="param_dtype", chunked_head=True)
    assert load_bytes_per_token(QWEN2_05B, bf16, None) == 25 * 61_440 + 7_168 == 1_543_168
    assert load_bytes_per_token(QWEN2_05B, bf16, 16_543) == 1_543_168 + 3 * 4 * 2_688 == 1_575_424
    # autocast over the full logits: today's 2,546,176, whatever the tokens
    assert load_bytes_per_token(QWEN2_05B, TrainerLoad(compute_bytes=2), 16_543) == 2_546_176
    # autocast, chunked: float32 residual layers (65,024) and the chunk's float32 buffers
    assert load_bytes_per_token(QWEN2_05B, TrainerLoad(compute_bytes=2, chunked_head=True), None) == \
        25 * 65_024 + 8_960 == 1_634_560


@pytest.mark.parametrize("share, checkpointing, tokens", [
    (0.5, False, 9216),  # (40 GiB - 8,891,301,888 - 2 GiB) x 0.8 / 2,546,176 = 10,026
    (0.5, True, 21504),  # ... / 1,136,640 = 22,459
    (0.0, False, 22528),  # (80 GiB - ...) x 0.8 / 2,546,176 = 23,520
    (0.95, False, 1024),  # nothing left: one row at a time, at least one rounding unit
])
def test_the_cuda_budget_by_hand(share, checkpointing, tokens):
    assert cuda_micro_batch_tokens(H100, share, TrainerLoad(compute_bytes=2, checkpointing=checkpointing)) == tokens


@pytest.mark.parametrize("load, tokens", [
    # 25,528,709,939 B usable (as above): / 1,543,168 = 16,543 tokens, chunk 2,688, / 1,575,424 = 16,204
    (TrainerLoad(compute_bytes=2, precision="param_dtype", chunked_head=True), 15_360),
    # / 1,634,560 = 15,618, chunk 2,816: / (1,634,560 + 12 x 2,816) = 15,301
    (TrainerLoad(compute_bytes=2, chunked_head=True), 14_336),
    # full logits: / (25 x 61,440 + 7,168 + 3 x 2 x 151,936 = 2,454,784) = 10,399
    (TrainerLoad(compute_bytes=2, precision="param_dtype"), 10_240),
])
def test_the_cuda_budget_follows_the_precision_path_and_the_head(load, tokens):
    assert cuda_micro_batch_tokens(H100, 0.5, load) == tokens


def test_budgets_precedence():
    assert micro_batch_budgets(0, 0, 9216) == (9216, 18432)
    assert micro_batch_budgets(4096, 0, 9216) == (4096, 8192)
    assert micro_batch_budgets(0, 5000, 9216) == (9216, 5000)


@pytest.mark.parametrize("overrides, device, budgets, basis", [
    ([], "cpu", (8192, 16384), "default"),
    (["actor.ppo_micro_batch_tokens=4096"], "cpu", (4096, 8192), "set"),
    (["actor.log_prob_micro_batch_tokens=1000"], "cpu", (8192, 1000), "default"),
    # CUDA's defaults: bf16 parameters over float32 masters, the head over vocabulary chunks
    (["trainer.device=cuda", "model.dtype=bfloat16"], None, (15360, 30720),
     "sized: 40.0 GiB left to the trainer, 1.50 MiB per token"),  # 1,575,424 B
    (["trainer.device=cuda", "model.dtype=bfloat16", "model.mixed_precision=autocast"], None, (14336, 28672),
     "sized: 40.0"),
    (["trainer.device=cuda", "model.dtype=bfloat16", "pipeline=one_step_off"], None, (15360, 30720), "sized: 40.0"),
    (["trainer.device=cuda", "model.dtype=bfloat16", "pipeline=one_step_off", "backend=ray"], None, (37888, 75776),
     "sized: 80.0 GiB"),  # Ray gives each side of a decoupled run its own GPUs
    # checkpointing: 24 x 896 x 2 + 2 x 61,440 + 7,168 = 173,056 B a token before the head's buffers
    (["trainer.device=cuda", "model.dtype=bfloat16", "model.enable_gradient_checkpointing=true"], None,
     (144384, 288768), "sized"),
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
