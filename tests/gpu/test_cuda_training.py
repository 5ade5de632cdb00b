"""The trainer and every pipeline on CUDA (skipped without a GPU): float32 masters on the GPU
under bf16 autocast, results back on the CPU; colocated, one_step_off and fully_async train with
`trainer.device=cuda model.dtype=bfloat16`, every weight sync verified bit for bit."""

from __future__ import annotations

import asyncio
import functools
import math

import pytest
import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.pipelines import pipeline_module
from asyncrl.training.actor import Actor
from tests.pipelines.helpers import make_context, read_jsonl
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import prepared_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_actor_trains_on_cuda_in_bf16_with_float32_masters():
    model = tiny_lm().cuda()
    actor = Actor(model, ActorConfig(lr=1e-2), temperature=1.0, norm_length=4, compute_dtype=torch.bfloat16)
    batch = prepared_batch(model, make_groups(), actor)  # built on the CPU
    assert batch.old_log_probs.device.type == "cpu"
    before = {k: v.clone() for k, v in model.named_parameters()}
    for _ in range(3):
        metrics = actor.train_step(batch, num_mini_batches=1)
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    assert all(t.dtype == torch.bfloat16 and t.is_cuda for t in actor.named_weights().values())


@pytest.mark.parametrize("pipeline", ["colocated", "one_step_off", "fully_async"])
def test_every_pipeline_trains_on_one_gpu(tiny_cache, tmp_path, pipeline):
    ctx = make_context(tmp_path, f"pipeline={pipeline}", "trainer.device=cuda", "model.dtype=bfloat16",
                       "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false")
    ctx.synchronizer.verify = True
    asyncio.run(pipeline_module(pipeline).run(ctx))
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) >= 3 and ctx.synchronizer.transfers >= 1
    assert all(math.isfinite(r["actor/pg_loss"]) for r in steps if "actor/pg_loss" in r)


def qwen2_small() -> torch.nn.Module:
    """Qwen2-shaped, head_dim 64 as Qwen2-0.5B's, random weights, on the GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=512, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_on_cuda_match_padded(dtype, monkeypatch):
    """model.use_remove_padding on CUDA (the default there): bf16 runs FlashAttention over the
    packed rows (torch's varlen_attn), float32 sdpa row by row; log-probs and gradients as padded."""
    import torch.nn.attention.varlen as varlen

    from asyncrl.algorithms.logprobs import logprobs_from_logits
    from asyncrl.training.actor import response_logits
    from asyncrl.training.batch import build_batch
    from asyncrl.training.packing import enable_packing
    from tests.training.test_packing import spread_groups

    calls = []
    flash = varlen.varlen_attn

    @functools.wraps(flash)  # keeps the signature packed attention checks
    def recording(*args, **kwargs):
        calls.append(args[0].shape)
        return flash(*args, **kwargs)

    monkeypatch.setattr(varlen, "varlen_attn", recording)
    batch = build_batch(spread_groups(), pad_id=0).to(torch.device("cuda"))
    results = []
    for pack in (False, True):
        model = qwen2_small()
        if pack:
            enable_packing(model)
        out = response_logits(model, batch, dtype, pack=pack)
        log_prob = out.to_rows(logprobs_from_logits(out.logits, out.labels))
        (log_prob * batch.response_mask).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((log_prob.detach() * batch.response_mask, grad))
    assert len(calls) == (2 if dtype == torch.bfloat16 else 0)  # one per layer
    (padded, padded_grad), (packed, packed_grad) = results
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(packed, padded, **tol)
    cosine = torch.nn.functional.cosine_similarity(packed_grad, padded_grad, dim=0)
    assert cosine > (0.99999 if dtype == torch.float32 else 0.99), float(cosine)
