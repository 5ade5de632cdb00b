"""The chunked log-prob + entropy head on CUDA (skipped without a GPU): chosen by default there,
bf16 values and gradients tracking the full-logits path under autocast, and at Qwen2's vocabulary
a forward + backward peak (`torch.cuda.max_memory_allocated`) under a quarter of the float32
logits, where the full path needs more than the logits."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.training.actor import Actor
from asyncrl.training.vocab_chunks import chunked_log_probs_entropy
from tests.training.helpers import make_groups, tiny_lm
from tests.training.test_actor import prepared_batch
from tests.training.test_vocab_chunks import QWEN_VOCAB, from_logits, unchunked

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_actor_takes_the_chunked_head_and_trains():
    model = tiny_lm().cuda()
    actor = Actor(model, ActorConfig(lr=1e-2, entropy_coeff=0.01), temperature=0.9, norm_length=4,
                  compute_dtype=torch.bfloat16)
    assert actor.head.chunked, actor.head.describe()
    batch = prepared_batch(model, make_groups(), actor)
    metrics = actor.train_step(batch, num_mini_batches=1)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_bf16_autocast_tracks_full_logits():
    """Both paths multiply in bf16 (logits rounded to bf16) and do the softmax in float32: equal up
    to one bf16 rounding of a logit (a kernel of another shape may accumulate in another order),
    eps_bf16 x max|z| per logit, moving a log-prob or an entropy by at most twice that each."""
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(512, 896, device="cuda", generator=g)
    weight = torch.randn(QWEN_VOCAB, 896, device="cuda", generator=g) / 30
    labels = torch.randint(0, QWEN_VOCAB, (512,), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = chunked_log_probs_entropy(hidden, weight, labels, 0.9)
        logits = hidden @ weight.T  # bf16, as lm_head under autocast
    want = from_logits(logits.float(), labels, 0.9)  # the float32 softmax math on those logits
    bound = 4 * torch.finfo(torch.bfloat16).eps * float(logits.float().abs().max()) / 0.9
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=bound)


def test_peak_memory_under_a_quarter_of_the_logits():
    """16K tokens x hidden 896: the weight gradient (V x 896 x 4 bytes, 545 MB) and the chunks
    (at most 512 MiB) stay under a quarter of the 10 GB of float32 logits; the full path, on 2K
    tokens, needs more than its logits."""
    peaks = {}
    for name, fn, n in (("chunked", chunked_log_probs_entropy, 16384), ("full", unchunked, 2048)):
        hidden = torch.randn(n, 896, device="cuda", requires_grad=True)
        weight = torch.randn(QWEN_VOCAB, 896, device="cuda", requires_grad=True)
        labels = torch.randint(0, QWEN_VOCAB, (n,), device="cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        logp, ent = fn(hidden, weight, labels, 1.0)
        (logp.sum() + ent.sum()).backward()
        torch.cuda.synchronize()
        peaks[name] = (torch.cuda.max_memory_allocated() - base, n * QWEN_VOCAB * 4)
        del hidden, weight, labels, logp, ent
    assert peaks["full"][0] >= peaks["full"][1], peaks
    assert peaks["chunked"][0] < peaks["chunked"][1] // 4, peaks
