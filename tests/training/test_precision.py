"""Mixed precision on the autocast path (`compute_dtype=torch.bfloat16`,
`mixed_precision="autocast"`; the default path is tests/training/test_mixed_precision.py's):
float32 master weights and optimizer state, bf16 forwards under autocast with float32 log-prob
math, bf16 weights for the engines; and the
device round trip (a batch on the CPU in, results on the CPU out). Runs on the CPU (autocast
supports bf16 there); tests/gpu repeats the device part on CUDA."""

from __future__ import annotations

import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.training.actor import Actor, RefWorker
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import plain_log_probs, prepared_batch


def test_bf16_compute_keeps_float32_masters_and_tracks_the_float32_log_probs():
    groups = make_groups()
    model = tiny_lm()
    actor = Actor(model, ActorConfig(lr=1e-2), temperature=1.0, norm_length=4, compute_dtype=torch.bfloat16,
                  mixed_precision="autocast")
    batch = prepared_batch(model, groups, actor)
    want = plain_log_probs(tiny_lm(), groups, 1.0)
    for i, w in enumerate(want):  # bf16 matmuls: close to float32, not equal
        got = batch.old_log_probs[i, : len(w)]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, w, rtol=0.05, atol=0.05)
        assert not torch.equal(got, w)
    before = {k: v.clone() for k, v in model.named_parameters()}
    for _ in range(3):  # the first step runs at the warm-up's lr 0
        metrics = actor.train_step(batch, num_mini_batches=1)
    assert torch.isfinite(torch.tensor(list(metrics.values()))).all()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = [s for s in actor.optimizer.state.values() if "exp_avg" in s]
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state)
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    exported = actor.named_weights()
    assert all(t.dtype == torch.bfloat16 for t in exported.values())
    torch.testing.assert_close(exported["model.embed_tokens.weight"],
                               model.model.embed_tokens.weight.detach().to(torch.bfloat16), rtol=0, atol=0)


def test_results_come_back_on_the_batch_device_and_in_row_order():
    groups = make_groups()
    model = tiny_lm()
    ref = RefWorker(model, 1.0, micro_batch_tokens=6, compute_dtype=torch.bfloat16, mixed_precision="autocast")
    batch = prepared_batch(model, groups, Actor(tiny_lm(), ActorConfig(), temperature=1.0, norm_length=4))
    out = ref.compute_log_probs(batch)
    assert out.device == batch.responses.device and out.shape == batch.responses.shape
    torch.testing.assert_close(out, batch.old_log_probs, rtol=0.05, atol=0.05)
    assert batch.to(torch.device("cpu")) is batch
