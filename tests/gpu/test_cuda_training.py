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
    assert actor.precision.path == "param_dtype"  # CUDA's default: bf16 parameters over float32 masters
    assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in model.parameters())
    assert all(m.dtype == torch.float32 and m.is_cuda for m in actor.weights.masters)
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


def expected_path(path: str, dtype: torch.dtype) -> str:
    """The path a packed call on this GPU takes: FlashAttention's varlen whenever this torch has
    it and the call is half precision (auto or forced), nested jagged SDPA where torch has it."""
    from asyncrl.training.attention_kernels import jagged_kernel, varlen_kernel

    half = dtype == torch.bfloat16
    if path in ("auto", "varlen") and varlen_kernel() is not None and half:
        return "varlen"
    if path in ("auto", "jagged") and jagged_kernel():
        return "jagged"
    return "grouped"


PACKED_CASES = [("auto", torch.bfloat16), ("auto", torch.float32), ("jagged", torch.bfloat16),
                ("jagged", torch.float32), ("grouped", torch.bfloat16)]


@pytest.mark.parametrize(("path", "dtype"), PACKED_CASES,
                         ids=[f"{p}-{str(d).removeprefix('torch.')}" for p, d in PACKED_CASES])
def test_packed_rows_on_cuda_match_padded(path, dtype, monkeypatch):
    """model.use_remove_padding on CUDA (the default there): bf16 runs FlashAttention over the
    packed rows (torch's varlen_attn) whenever this torch has it, float32 nested jagged SDPA;
    each path forced runs where it can; log-probs and gradients as padded."""
    from asyncrl.algorithms.logprobs import logprobs_from_logits
    from asyncrl.training import packed_attention
    from asyncrl.training.batch import build_batch
    from asyncrl.training.logits import response_logits
    from asyncrl.training.packing import enable_packing
    from tests.training.test_packing import spread_groups

    calls = []
    try:
        import torch.nn.attention.varlen as varlen
    except ImportError:
        varlen = None
    if varlen is not None:
        flash = varlen.varlen_attn

        @functools.wraps(flash)  # keeps the signature the call is built from
        def recording(*args, **kwargs):
            calls.append(args[0].shape)
            return flash(*args, **kwargs)

        monkeypatch.setattr(varlen, "varlen_attn", recording)
    batch = build_batch(spread_groups(), pad_id=0).to(torch.device("cuda"))
    results = []
    for pack in (False, True):
        model = qwen2_small()
        if pack:
            packed_attention.use_packed_attention(model, path)
            enable_packing(model)
            packed_attention.PATHS.clear()  # check_packing's float32 calls above
        out = response_logits(model, batch, dtype, pack=pack)
        log_prob = out.to_rows(logprobs_from_logits(out.logits, out.labels))
        (log_prob * batch.response_mask).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((log_prob.detach() * batch.response_mask, grad))
    runs = expected_path(path, dtype)
    layers = model.config.num_hidden_layers
    assert packed_attention.PATHS == {runs: layers}
    assert len(calls) == (layers if runs == "varlen" else 0)
    (padded, padded_grad), (packed, packed_grad) = results
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(packed, padded, **tol)
    cosine = torch.nn.functional.cosine_similarity(packed_grad, padded_grad, dim=0)
    assert cosine > (0.99999 if dtype == torch.float32 else 0.99), float(cosine)
