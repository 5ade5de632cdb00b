"""Log-probs and entropies over chunks of the vocabulary (`asyncrl.training.vocab_chunks`): values
and gradients (hidden states, head weight, bias) equal the unchunked computation within rounding
bounds derived below, gradcheck passes in float64, a bf16 head multiplies in bf16 with float32
statistics, at vocabulary 151,936 the values hold and the forward + backward peak stays under a
quarter of the full float32 logits; in the actor the chunked
head gives the full-logits path's log-probs, entropies and updates, and `choose_head` falls back,
with its reason, where the chunked head cannot run or does not pay.

Rounding bounds (one float evaluation vs the exact value; Higham eq. 4.4 via `sum_error`: a sum
of n terms is within n eps sum|x_i| of exact). Per token, with z = (h W^T + b) / T:
  dz    = (H + 1) eps max_v (|h| |W|^T + |b|)_v / T + eps max|z|   a logit: H products and a bias
  dlse  = (V + C) eps + dz + eps |lse|     a positive sum's relative error is log's absolute one;
                                           V terms in the chunks' sums, C chunks combined
  dp    = dz + dlse + eps                  relative error of p_v = exp(z_v - lse)
  dmean = (V + C) eps max|z| + dz + dp max|z|   E_p[z] = sum_v p_v z_v
  log p_y: dz + dlse + eps |log p_y|       H: dlse + dmean + eps |H|
Gradients: G_v = g_l (onehot_v - p_v) - g_H p_v (z_v - E_p[z]) is within
  dG_v = p_v (dp (|g_l| + |g_H| |z_v - E|) + |g_H| (dz + dmean)) + 4 eps |terms of G_v|
and d/dh = G W / T sums V terms, d/dW = G^T h / T and d/db sum N:
  bound = n eps (|G| |.|) / T + (dG |.|) / T + eps |result|.
Two float evaluations are each within the bound of the exact value; float32 results are compared
with the float64 unchunked computation (its own float64 bound added).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from asyncrl.config.schema import ActorConfig
from asyncrl.scheduling.micro_budget import chunk_size
from asyncrl.training import logits as logits_module
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import build_batch
from asyncrl.training.logits import response_logits
from asyncrl.training.vocab_chunks import (
    CPU_MIN_VOCAB,
    HeadChoice,
    choose_head,
    chunked_log_probs_entropy,
)
from tests.tolerances import Lockstep, assert_same_steps, assert_within, eps_of, sum_error
from tests.training.helpers import VOCAB, gradient_terms, groups_of_lengths, make_groups, tiny_lm

QWEN_VOCAB = 151_936
LR = 1e-2


def unchunked(hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float,
              bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The reference: full (N, V) logits, plain torch autograd."""
    z = hidden @ weight.T
    return from_logits(z if bias is None else z + bias, labels, temperature)


def from_logits(logits: Tensor, labels: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    z = logits / temperature
    lse = torch.logsumexp(z, -1)
    entropy = lse - (torch.softmax(z, -1) * z).sum(-1)
    return z.gather(-1, labels[:, None]).squeeze(-1) - lse, entropy


def make_inputs(n: int, h: int, v: int, dtype: torch.dtype, bias: bool, seed: int = 0) -> list[Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) / math.sqrt(h) * 3  # logits of a few units
    b = torch.randn(v, generator=g, dtype=torch.float64) if bias else None
    labels = torch.randint(0, v, (n,), generator=g)
    grads = torch.randn(2, n, generator=g, dtype=torch.float64)  # upstream of log-prob, entropy
    # float32 values, so the float64 reference computes on exactly the float32 inputs
    hidden, weight, b, grads = (None if t is None else t.to(dtype).double() for t in (hidden, weight, b, grads))
    return [hidden, weight, b, labels, grads[0], grads[1]]


def leaves(tensors: list[Tensor | None], dtype: torch.dtype) -> list[Tensor | None]:
    return [None if t is None else t.detach().to(dtype, copy=True).requires_grad_() for t in tensors]


def run(fn, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float,
        g_logp: Tensor | None, g_ent: Tensor | None, dtype: torch.dtype, **kwargs) -> dict[str, Tensor]:
    """Values and gradients of `fn` at `dtype`; the loss is sum g_l log p + sum g_H H (an absent
    upstream: that output stays out of the loss)."""
    h, w, b = leaves([hidden, weight, bias], dtype)
    logp, ent = fn(h, w, labels, temperature, b, **kwargs)
    loss = sum((out * g.to(dtype)).sum() for out, g in ((logp, g_logp), (ent, g_ent)) if g is not None)
    loss.backward()
    out = {"logp": logp.detach(), "entropy": ent.detach(), "hidden": h.grad, "weight": w.grad}
    return out | ({"bias": b.grad} if b is not None else {})


def bounds(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float,
           g_logp: Tensor | None, g_ent: Tensor | None, dtype: torch.dtype, chunks: int) -> dict[str, Tensor]:
    """Per element, how far one `dtype` evaluation can be from the exact values and gradients
    (the module docstring's bounds, from float64 quantities)."""
    eps = eps_of(dtype)
    n, width = hidden.shape
    vocab = weight.shape[0]
    b = torch.zeros(vocab, dtype=torch.float64) if bias is None else bias
    z = (hidden @ weight.T + b) / temperature  # (N, V)
    zmax = z.abs().amax(-1, keepdim=True)
    dz = sum_error(dtype, width + 1, 1.0) * ((hidden.abs() @ weight.abs().T + b.abs()) / temperature).amax(
        -1, keepdim=True) + eps * zmax
    lse = torch.logsumexp(z, -1, keepdim=True)
    p = (z - lse).exp()
    mean = (p * z).sum(-1, keepdim=True)
    logp = z.gather(-1, labels[:, None]) - lse
    dlse = sum_error(dtype, vocab + chunks, 1.0) + dz + eps * lse.abs()
    dp = dz + dlse + eps
    dmean = sum_error(dtype, vocab + chunks, 1.0) * zmax + dz + dp * zmax
    gl = (torch.zeros(n) if g_logp is None else g_logp).double()[:, None]
    gh = (torch.zeros(n) if g_ent is None else g_ent).double()[:, None]
    onehot = torch.zeros_like(z).scatter_(-1, labels[:, None], 1.0)
    G = gl * (onehot - p) - gh * p * (z - mean)
    dG = p * (dp * (gl.abs() + gh.abs() * (z - mean).abs()) + gh.abs() * (dz + dmean)) + 4 * eps * (
        gl.abs() * (onehot + p) + gh.abs() * p * (z - mean).abs())
    out = {"logp": (dz + dlse + eps * logp.abs()).squeeze(-1),
           "entropy": (dlse + dmean + eps * (lse - mean).abs()).squeeze(-1),
           "hidden": (sum_error(dtype, vocab, 1.0) * G.abs() @ weight.abs() + dG @ weight.abs()) / temperature
           + eps * (G @ weight).abs() / temperature,
           "weight": (sum_error(dtype, n, 1.0) * G.abs().T @ hidden.abs() + dG.T @ hidden.abs()) / temperature
           + eps * (G.T @ hidden).abs() / temperature}
    if bias is not None:
        out["bias"] = (sum_error(dtype, n, 1.0) * G.abs().sum(0) + dG.sum(0) + eps * G.sum(0).abs()) / temperature
    return out


def test_docstring_example():
    logp, ent = chunked_log_probs_entropy(torch.tensor([[1.0]]), torch.tensor([[0.0], [math.log(3)]]),
                                          torch.tensor([1]), chunk=1)
    torch.testing.assert_close(logp, torch.tensor([math.log(0.75)]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ent, torch.tensor([0.562335]), rtol=1e-6, atol=1e-6)
    assert chunk_size(512, QWEN_VOCAB, 16 << 20) == 2688
    assert chunk_size(4, 100, 16 << 20) == 100  # under one aligned tile: one chunk
    assert chunk_size(100_000, 1000, 1) == 128  # at least one aligned tile


@pytest.mark.parametrize("outputs", ["both", "log-prob", "entropy"])
@pytest.mark.parametrize("chunk", [1, 5, 16, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_float64_values_and_gradients_equal_unchunked(chunk, temperature, outputs):
    """37 vocabulary rows: chunks of 5 and 16 leave a short last chunk, 64 is one chunk; with a
    bias; the loss uses both outputs or one (the other's backward is skipped)."""
    hidden, weight, bias, labels, g_logp, g_ent = make_inputs(6, 8, 37, torch.float64, bias=True)
    g_logp = None if outputs == "entropy" else g_logp
    g_ent = None if outputs == "log-prob" else g_ent
    args = (hidden, weight, bias, labels, temperature, g_logp, g_ent, torch.float64)
    got = run(chunked_log_probs_entropy, *args, chunk=chunk)
    want = run(unchunked, *args)
    bound = bounds(*args, chunks=math.ceil(37 / chunk))
    for key, value in want.items():
        assert_within(got[key], value, 2 * bound[key], key)  # two float64 evaluations
    assert want["weight"].abs().sum() > 0


@pytest.mark.parametrize("vocab,chunk", [(37, 5), (QWEN_VOCAB, 0)], ids=["small", "qwen-vocab"])
def test_float32_is_within_rounding_of_exact(vocab, chunk):
    """float32 chunked (and, as a check of the bound, float32 unchunked) against the float64
    computation, at temperature 0.7; at vocabulary 151,936 with the default chunk."""
    n, width = (6, 8) if vocab < 1000 else (32, 16)
    hidden, weight, bias, labels, g_logp, g_ent = make_inputs(n, width, vocab, torch.float32, bias=False)
    args = (hidden, weight, bias, labels, 0.7, g_logp, g_ent)
    exact = run(unchunked, *args, torch.float64)
    used = chunk or chunk_size(n, vocab, 16 << 20)
    bound32 = bounds(*args, torch.float32, chunks=math.ceil(vocab / used))
    bound64 = bounds(*args, torch.float64, chunks=1)
    for fn, kwargs in ((chunked_log_probs_entropy, {"chunk": chunk}), (unchunked, {})):
        got = run(fn, *args, torch.float32, **kwargs)
        for key, value in exact.items():
            assert got[key].dtype == torch.float32
            assert_within(got[key], value, bound32[key] + bound64[key], f"{fn.__name__} {key}")


def test_gradcheck_float64():
    hidden, weight, bias, labels, _, _ = make_inputs(3, 4, 7, torch.float64, bias=True)
    inputs = tuple(t.clone().requires_grad_() for t in (hidden, weight, bias))

    def fn(h: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return chunked_log_probs_entropy(h, w, labels, 0.7, b, chunk=3)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


_PEAK_SCRIPT = textwrap.dedent("""
    import json, re, sys
    import torch
    from asyncrl.training.vocab_chunks import chunked_log_probs_entropy

    def status(key):
        return 1024 * int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    def peak(fn):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status("VmRSS")
        fn()
        return status("VmHWM") - before

    def forward_backward(head, hidden, weight, y):
        hidden.grad = weight.grad = None
        logp, ent = head(hidden, weight, y)
        (logp.sum() + ent.sum()).backward()

    def full(hidden, weight, labels):
        z = hidden @ weight.T
        lse = torch.logsumexp(z, -1)
        return z.gather(-1, labels[:, None]).squeeze(-1) - lse, lse - (torch.softmax(z, -1) * z).sum(-1)

    torch.set_num_threads(1)
    n, width, vocab = (int(a) for a in sys.argv[1:4])
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, width, generator=g).requires_grad_()
    w = torch.randn(vocab, width, generator=g).requires_grad_()
    y = torch.randint(0, vocab, (n,), generator=g)
    small = w[:4096].detach().clone().requires_grad_()
    forward_backward(chunked_log_probs_entropy, h, small, y % 4096)  # kernels and thread pools loaded
    del small
    chunked = peak(lambda: forward_backward(chunked_log_probs_entropy, h, w, y))
    probe = peak(lambda: torch.ones(n * vocab // 4))  # n x vocab bytes, written
    unchunked = peak(lambda: forward_backward(full, h, w, y))
    print(json.dumps({"chunked": chunked, "probe": probe, "unchunked": unchunked}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")
def test_peak_memory_at_qwen_vocab_stays_under_a_quarter_of_the_logits():
    """Peak resident memory of forward + backward (both outputs, gradients of hidden states and
    weight) in a fresh process, against N x V x 4 / 4 bytes.

    How it is measured: torch's CPU allocator has no statistics and tracemalloc does not see it,
    so the process's resident set is read: its high-water mark (VmHWM) is reset to the current
    resident size through /proc/self/clear_refs before the call and read after it. glibc returns
    memory of blocks above its mmap threshold to the system on free; fixing that threshold at
    64 KiB (MALLOC_MMAP_THRESHOLD_, which also stops glibc raising it after a free) gives every
    tensor its own mapping, so resident memory follows the live tensors and a reused free block
    cannot hide an allocation. A written probe of a known size checks the method sees torch's
    memory, and the unchunked computation's peak (over the full logits) checks it can fail.
    One thread: no per-thread scratch; the count does not depend on the machine's cores.

    Hidden width 16: the weight gradient (V x H x 4 bytes, an output the unchunked path makes
    too) is then N / (4 H) = 1/4 of the bound, leaving the rest to the chunks."""
    n, width = 256, 16
    quarter = n * QWEN_VOCAB * 4 // 4
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(n), str(width), str(QWEN_VOCAB)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    if "clear_refs" in done.stderr and "Errno" in done.stderr:
        pytest.skip("/proc/self/clear_refs is not writable here")
    assert done.returncode == 0, done.stderr[-2000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    # the method sees a written torch allocation (the kernel counts resident pages per CPU in
    # batches, so a reading may lag by a few hundred KiB)
    assert peaks["probe"] >= n * QWEN_VOCAB - (1 << 20), peaks
    assert peaks["unchunked"] >= n * QWEN_VOCAB * 4, peaks  # full float32 logits: over the bound
    assert peaks["chunked"] < quarter, f"{peaks['chunked'] / 2**20:.1f} MiB >= {quarter / 2**20:.1f} MiB: {peaks}"


def test_choose_head_reasons():
    model = tiny_lm()
    auto = choose_head(model)
    assert not auto.chunked and f"vocabulary {VOCAB} < {CPU_MIN_VOCAB} on cpu" in auto.reason
    assert choose_head(model, "chunked") == HeadChoice(True, "asked for")
    assert not choose_head(model, "full").chunked


def test_choose_head_falls_back_for_a_lora_wrapped_head():
    from asyncrl.training.lora import apply_lora

    wrapped = apply_lora(tiny_lm(), 4, 8, ("q_proj", "lm_head"))
    choice = choose_head(wrapped, "chunked")
    assert not choice.chunked and "not a plain nn.Linear" in choice.reason
    assert choose_head(apply_lora(tiny_lm(), 4, 8, ("q_proj",)), "chunked").chunked  # head not wrapped


def test_choose_head_falls_back_when_the_model_changes_its_logits():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, head_dim=8, final_logit_softcapping=2.0)
    choice = choose_head(Gemma2ForCausalLM(cfg).eval(), "chunked")
    assert not choice.chunked and "soft-capped or scaled" in choice.reason


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_tied_model_log_probs_entropies_and_gradients_equal_full_logits(pack):
    """The tiny Llama (tied head: the embedding matrix), float64, temperature 0.8: per-token
    results and every parameter's gradient (the embedding's sums the head's and the input's)."""
    batch = build_batch(make_groups(3, 3), pad_id=0)
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = {}
    for chunked_at in (None, 0.8):
        model = tiny_lm().double()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        out = response_logits(model, batch, pack=pack, chunked_at=chunked_at)
        logp, ent = out.log_probs(0.8), out.entropies(0.8)
        ((logp + 0.1 * ent) * weights * batch.response_mask).sum().backward()
        got[chunked_at] = [(logp * batch.response_mask).detach(), (ent * batch.response_mask).detach(),
                           *(p.grad for p in model.parameters())]
    assert got[None][2].abs().sum() > 0
    terms = int(batch.response_mask.sum()) * 2 * VOCAB  # tokens x outputs, each a sum over the vocabulary
    for full, chunked in zip(got[None], got[0.8], strict=True):
        assert_within(chunked, full, sum_error(torch.float64, terms, float(full.abs().max())), "tied model")


def fused_calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Temperatures `fused_head` is entered with from the logits module (the actor's forwards)."""
    calls: list[float] = []
    real = logits_module.fused_head

    def spy(model: nn.Module, labels: Tensor, temperature: float):
        calls.append(temperature)
        return real(model, labels, temperature)

    monkeypatch.setattr(logits_module, "fused_head", spy)
    return calls


def test_actor_chunked_head_steps_equal_full_logits(monkeypatch):
    """Old log-probs, reference log-probs and one train step (entropy and KL losses, packed rows)
    with the chunked head forced, against the full-logits path: the path that ran is recorded."""
    groups = groups_of_lengths([2, 5, 3], [[7, 1, 3], [2, 9, 4], [1, 5, 2]])
    batch = build_batch(groups, pad_id=0)
    from asyncrl.algorithms import compute_advantage

    batch.advantages, _ = compute_advantage("grpo", batch.token_level_scores, batch.response_mask, batch.index)
    cfg = ActorConfig(ppo_micro_batch_tokens=40, lr=LR, warmup_steps=0, grad_clip=1e9, entropy_coeff=0.01,
                      use_kl_loss=True, kl_loss_coef=0.1)
    calls = fused_calls(monkeypatch)
    lead, results = Lockstep(), []
    for lock in (lead, Lockstep(leader=lead)):
        actor = Actor(tiny_lm().double(), cfg, temperature=0.8, norm_length=8)
        ref = RefWorker(tiny_lm(1).double(), 0.8, 40)
        assert not actor.head.chunked and not ref.head.chunked  # vocabulary 32 on cpu
        if lock is not lead:
            actor.head = ref.head = HeadChoice(True, "test")
        old, ref_lp = actor.compute_log_probs(batch), ref.compute_log_probs(batch)
        if lock is lead:  # both steps from the same inputs
            batch.old_log_probs, batch.ref_log_probs = old - 0.05 * batch.response_mask, ref_lp
        lock.attach(actor.model, actor.optimizer)
        results.append((old, ref_lp, actor.train_step(batch, num_mini_batches=1)))
    assert calls and set(calls) == {0.8}  # the chunked run went through the fused head
    (old, ref_lp, metrics), (old_c, ref_c, metrics_c) = results
    tokens = int(batch.response_mask.sum())
    value_bound = sum_error(torch.float64, VOCAB, 1.0) * float(old.abs().max() + 1)
    assert_within(old_c, old, value_bound, "old log-probs")
    assert_within(ref_c, ref_lp, value_bound, "ref log-probs")
    assert_same_steps(lead.steps, lock.steps, [gradient_terms(cfg, tokens) * VOCAB], LR)
    assert metrics_c["actor/entropy"] == pytest.approx(metrics["actor/entropy"], rel=1e-9)


@pytest.mark.parametrize("where", ["bf16-weights", "autocast"])
def test_bf16_matmul_with_float32_statistics(where):
    """bf16 head weights (as FSDP's bf16 parameters), or float32 ones under CPU autocast: the
    chunks multiply in bf16 as lm_head would, the outputs are float32 and match the float32
    softmax over lm_head's bf16 logits. Two kernels of other shapes accumulate a logit in another
    order (H eps32 sum|h w|) and may round it to the other neighbouring bf16 value (eps_bf16 |z|);
    a log-prob moves by at most 2 max|dz|, an entropy (dH/dz_j = -p_j (z_j - E_p[z])) by at most
    2 max|z| max|dz|; plus float32 rounding of the vocabulary sums (`sum_error`)."""
    hidden, weight, _, labels, _, _ = make_inputs(16, 32, 1000, torch.float32, bias=False)
    dtype = torch.bfloat16 if where == "bf16-weights" else torch.float32
    h, w = (t.to(dtype).requires_grad_() for t in (hidden, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "autocast"):
        got = chunked_log_probs_entropy(h, w, labels, 0.7, chunk=300)
        logits = h @ w.T  # what lm_head returns: bf16
    assert logits.dtype == torch.bfloat16 and all(t.dtype == torch.float32 for t in got)
    want = from_logits(logits.detach().float(), labels, 0.7)
    zmax = float(logits.detach().float().abs().max()) / 0.7
    products = float((hidden.abs() @ weight.abs().T).max())  # max_v sum_i |h_i w_vi|
    dz = eps_of(torch.bfloat16) * zmax + sum_error(torch.float32, 32, products) / 0.7
    rounding = sum_error(torch.float32, 1000 + 4, 1.0) * (1 + zmax)
    assert_within(got[0].detach(), want[0], 2 * dz + rounding, "log-prob")
    assert_within(got[1].detach(), want[1], 2 * zmax * dz + rounding, "entropy")
    (got[0].sum() + got[1].sum()).backward()
    assert h.grad.dtype == w.grad.dtype == dtype and bool(w.grad.abs().sum() > 0)
