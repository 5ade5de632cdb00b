"""Token log-probs and entropies straight from the hidden states, over chunks of the vocabulary.

The output head of a 150K-token vocabulary makes (tokens x vocabulary) logits the largest
tensors of a step: 16K response tokens x 151,936 x 4 bytes is 10 GB in float32, and the
unchunked path keeps them (and their gradient) alive. `chunked_log_probs_entropy(hidden, weight,
labels, temperature)` never builds them: it walks the vocabulary in chunks of `chunk` rows of the
head, computes each chunk's logits in float32, folds them into per-token statistics and drops
them; the backward recomputes each chunk's logits from the saved inputs and forms the gradients
of the hidden states and the head weight chunk by chunk. Peak extra memory is a few (tokens x
chunk) float32 buffers, chosen from a byte budget (`chunk_size`, in the memory model
`asyncrl.scheduling.micro_budget`, which sizes CUDA micro-batches with it). This is the technique of
Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, which computes the gradients in the
forward instead) and of Apple's Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your Losses in
Large-Vocabulary Language Models", which recomputes in the backward as here), extended with the
entropy of the same distribution in the same pass.

Math (per token; z = (h W^T + b) / T the tempered logits, p = softmax(z), y the label):

    forward, chunk c:   lse_c = logsumexp(z_c),  m_c = sum_{v in c} softmax(z_c)_v z_v
    across chunks:      lse = logsumexp_c(lse_c),  E_p[z] = sum_c exp(lse_c - lse) m_c
    outputs:            log p_y = z_y - lse,  H = -sum_v p_v log p_v = lse - E_p[z]

    backward (d lse / d z_j = p_j; d p_k / d z_j = p_k (delta_kj - p_j)):
        d log p_y / d z_j = delta_jy - p_j
        d E_p[z] / d z_j = p_j + sum_k z_k p_k (delta_kj - p_j) = p_j + p_j (z_j - E_p[z])
        d H / d z_j = p_j - d E_p[z] / d z_j = -p_j (z_j - E_p[z])
    so, with upstream gradients g_l (log-prob) and g_H (entropy):
        G_j = d L / d z_j = g_l (delta_jy - p_j) - g_H p_j (z_j - E_p[z])
        d L / d h = (G / T) W,   d L / d W = (G / T)^T h,   d L / d b = sum_tokens G / T
    Only lse and E_p[z] (two floats per token) are kept for the backward, besides the inputs.

Precision: the chunk's matmul runs in the dtype the head would run in (the autocast dtype under
autocast, else the inputs' dtype: bf16 parameters give a bf16 matmul, as `lm_head` itself would),
its logits are taken to float32 (float64 stays float64) before any softmax math; the hidden
states' gradient is accumulated over chunks in float32. A tied head (the embedding matrix) gets
its gradient added to the embedding's by autograd, as any shared parameter does.

`fused_head(model, labels, temperature)` runs this inside the model's own forward, in place of
the output head's matmul (its `forward` swapped for the duration), so the model returns
(..., 2) [log-prob, entropy] instead of (..., V) logits and FSDP sees the head's parameters where
it gathers them. `choose_head(model)` decides whether a model can take it and whether it pays;
`HeadChoice` says which path runs and why, for the run's log and for tests.

Not here: which positions are response tokens (`asyncrl.training.logits.response_logits`), or the unchunked
path (`asyncrl.algorithms.logprobs`, which works from the full logits).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from asyncrl.scheduling.micro_budget import HEAD_CHUNK_BYTES, chunk_size

log = logging.getLogger(__name__)

# Below this vocabulary on the CPU the full logits are small: the head is a negligible part of a
# step (both paths measured equal at vocabulary 128) and the full path keeps CPU runs as they were.
CPU_MIN_VOCAB = 32768


def matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype `lm_head(hidden)` would multiply in here: autocast's when it is on, else the
    promoted dtype of the operands."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, rows: slice, mm: torch.dtype,
                  temperature: float) -> Tensor:
    """(N, c) tempered logits of head rows `rows`, in the statistics dtype. `h`: (N, H) in `mm`."""
    z = h @ weight[rows].to(mm).T
    if bias is not None:
        z = z + bias[rows].to(mm)
    return z.to(_stats_dtype(mm)).div_(temperature)


def _in_chunk(labels: Tensor, rows: slice, width: int) -> tuple[Tensor, Tensor]:
    """(whether each label falls in `rows`, its column there, clamped in range). # (N,), (N, 1)"""
    start = rows.start
    inside = (labels >= start) & (labels < start + width)
    return inside, (labels - start).clamp(0, width - 1).unsqueeze(-1)


class _ChunkedHead(torch.autograd.Function):
    """(log p_y, H) per token from (N, H) hidden states and a (V, H) head; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                temperature: float, chunk: int, mm: torch.dtype) -> tuple[Tensor, Tensor]:
        with torch.autocast(hidden.device.type, enabled=False):
            lse, mean, target = _forward_stats(hidden, weight, bias, labels, temperature, chunk, mm)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, mean)
        ctx.temperature, ctx.chunk, ctx.mm = temperature, chunk, mm
        ctx.set_materialize_grads(False)  # an unused output (the entropy, mostly) costs nothing
        return target - lse, lse - mean

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp: Tensor | None,
                 grad_ent: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
        hidden, weight, bias, labels, lse, mean = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logp is None and grad_ent is None:
            return None, None, None, None, None, None, None
        mm, stats = ctx.mm, lse.dtype
        h = hidden.to(mm)
        grad_h = torch.zeros(hidden.shape, dtype=stats, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b and bias is not None else None
        with torch.autocast(hidden.device.type, enabled=False):
            for rows in _chunks(weight.shape[0], ctx.chunk):
                z = _chunk_logits(h, weight, bias, rows, mm, ctx.temperature)
                g = _logit_grad(z, labels, rows, lse, mean, grad_logp, grad_ent).div_(ctx.temperature)
                g_mm = g.to(mm)
                if grad_h is not None:
                    grad_h += (g_mm @ weight[rows].to(mm)).to(stats)
                if grad_w is not None:
                    grad_w[rows] = (g_mm.T @ h).to(weight.dtype)
                if grad_b is not None:
                    grad_b[rows] = g.sum(0).to(grad_b.dtype)
        grad_hidden = grad_h.to(hidden.dtype) if grad_h is not None else None
        return grad_hidden, grad_w, grad_b, None, None, None, None


def _chunks(vocab: int, chunk: int) -> Iterator[slice]:
    return (slice(start, min(start + chunk, vocab)) for start in range(0, vocab, chunk))


def _forward_stats(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, temperature: float,
                   chunk: int, mm: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(lse, E_p[z], z_y) per token, one chunk of the head at a time. # 3 x (N,)"""
    h = hidden.to(mm)
    n = hidden.shape[0]
    target = torch.zeros(n, dtype=_stats_dtype(mm), device=hidden.device)
    lse_C, mean_C = [], []
    for rows in _chunks(weight.shape[0], chunk):
        z = _chunk_logits(h, weight, bias, rows, mm, temperature)  # (N, c)
        top = z.amax(-1, keepdim=True)
        p = (z - top).exp_()  # unnormalised within the chunk
        total = p.sum(-1)
        lse_C.append(top.squeeze(-1) + total.log())
        # sum_v p_v z_v as a batched dot product: no third (N, c) buffer
        mean_C.append(torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(n) / total)
        inside, col = _in_chunk(labels, rows, z.shape[1])
        target += torch.where(inside, z.gather(-1, col).squeeze(-1), 0.0)
    lse_stack = torch.stack(lse_C)  # (C, N)
    lse = torch.logsumexp(lse_stack, 0)
    mean = ((lse_stack - lse).exp() * torch.stack(mean_C)).sum(0)
    return lse, mean, target


def _logit_grad(z: Tensor, labels: Tensor, rows: slice, lse: Tensor, mean: Tensor, grad_logp: Tensor | None,
                grad_ent: Tensor | None) -> Tensor:
    """G = g_l (onehot_y - p) - g_H p (z - E_p[z]) for one chunk, in place of `z`. # (N, c)"""
    p = (z - lse.unsqueeze(-1)).exp_()
    if grad_ent is not None:
        g = z.sub_(mean.unsqueeze(-1)).mul_(grad_ent.unsqueeze(-1))
        if grad_logp is not None:
            g.add_(grad_logp.unsqueeze(-1))
        g.mul_(p).neg_()
    else:
        assert grad_logp is not None
        g = p.mul_(-grad_logp.unsqueeze(-1))
    if grad_logp is not None:
        inside, col = _in_chunk(labels, rows, g.shape[1])
        g.scatter_add_(-1, col, torch.where(inside, grad_logp, 0.0).unsqueeze(-1))
    return g


def chunked_log_probs_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float = 1.0,
                              bias: Tensor | None = None, *, chunk: int = 0,
                              budget_bytes: int = 0) -> tuple[Tensor, Tensor]:
    """(log softmax(z)[labels], entropy of softmax(z)) with z = (hidden W^T + b) / temperature,
    computed over chunks of the vocabulary (float32 math; float64 inputs stay float64).

    `hidden` (..., H), `weight` (V, H), `labels` (...) -> two (...) tensors. `chunk`: head rows
    per chunk (0: from `budget_bytes`, 0: the device's `HEAD_CHUNK_BYTES`).
    Example: hidden [[1.0]], weight [[0], [ln 3]], label 1 -> logits [0, ln 3], p = [0.25, 0.75]:
    log-prob log 0.75 = -0.287682, entropy 0.562335 nats."""
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    assert hidden.shape[:-1] == labels.shape, f"hidden {tuple(hidden.shape)} vs labels {tuple(labels.shape)}"
    mm = matmul_dtype(hidden, weight)
    flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).long()
    if not chunk:
        budget = budget_bytes or HEAD_CHUNK_BYTES.get(hidden.device.type, HEAD_CHUNK_BYTES["cuda"])
        chunk = chunk_size(flat_h.shape[0], weight.shape[0], budget, torch.finfo(_stats_dtype(mm)).bits // 8)
    logp, ent = _ChunkedHead.apply(flat_h, weight, bias, flat_y, temperature, chunk, mm)
    return logp.view(labels.shape), ent.view(labels.shape)


@dataclass(frozen=True)
class HeadChoice:
    """Which path computes log-probs and entropies, and why: `chunked` (this module, from the
    hidden states) or the full logits (`asyncrl.algorithms.logprobs`)."""

    chunked: bool
    reason: str

    def describe(self) -> str:
        return f"{'chunked' if self.chunked else 'full logits'} ({self.reason})"


def output_head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


def choose_head(model: nn.Module, mode: str = "auto") -> HeadChoice:
    """The path for `model` ("auto": chunked where it can run and pays: on CUDA, or a vocabulary
    of at least `CPU_MIN_VOCAB`; "chunked" / "full": that path where it can run). Chunked needs a
    plain `nn.Linear` head (a LoRA-wrapped head adds its adapter's output outside the weight) whose
    output the model returns as its logits (`check_head`: no soft-capping or scaling after it)."""
    choice = _choose(model, mode)
    log.info("log-probs and entropy for %s: %s", type(model).__name__, choice.describe())
    return choice


def _choose(model: nn.Module, mode: str) -> HeadChoice:
    assert mode in ("auto", "chunked", "full"), mode
    head = output_head(model)
    if mode == "full":
        return HeadChoice(False, "asked for")
    if type(head) is not nn.Linear:
        return HeadChoice(False, f"the output head is {type(head).__name__}, not a plain nn.Linear "
                                 "(e.g. LoRA-wrapped), so its logits are not x W^T + b")
    device = head.weight.device
    if mode == "auto" and device.type == "cpu" and head.out_features < CPU_MIN_VOCAB:
        return HeadChoice(False, f"vocabulary {head.out_features} < {CPU_MIN_VOCAB} on cpu: the full logits "
                                 "are small there")
    problem = check_head(model)
    if problem:
        return HeadChoice(False, problem)
    return HeadChoice(True, "asked for" if mode == "chunked" else f"{device.type}, vocabulary {head.out_features}")


@torch.no_grad()
def check_head(model: nn.Module) -> str:
    """'' when `model` run through `fused_head` on a few tokens gives the log-probs of its own
    logits; else what differs (a model that soft-caps or scales its logits after the head)."""
    from asyncrl.algorithms.logprobs import logprobs_from_logits

    head = output_head(model)
    assert isinstance(head, nn.Linear), f"check_head needs a plain nn.Linear head, got {type(head).__name__}"
    device = head.weight.device
    ids = torch.arange(1, 6, device=device)[None] % head.weight.shape[0]
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, use_cache=False).logits
        want = logprobs_from_logits(logits, ids)
        with fused_head(model, ids, 1.0):
            got = model(input_ids=ids, use_cache=False).logits[..., 0]
    finally:
        model.train(was_training)
    if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-3):
        return f"{type(model).__name__}'s logits are not its head's output (soft-capped or scaled after it)"
    return ""


@contextmanager
def fused_head(model: nn.Module, labels: Tensor, temperature: float) -> Iterator[None]:
    """Within the block, `model`'s output head returns (..., 2) [log-prob of `labels`, entropy]
    at `temperature` (`chunked_log_probs_entropy`) instead of (..., V) logits; `labels` must have
    the shape of the positions the head is called on (`logits_to_keep`'s)."""
    head = output_head(model)
    assert isinstance(head, nn.Linear), f"fused_head needs a plain nn.Linear head, got {type(head).__name__}"

    def forward(hidden: Tensor) -> Tensor:
        # read the weight at call time: FSDP swaps in the gathered parameter for the forward
        logp, ent = chunked_log_probs_entropy(hidden, head.weight, labels, temperature, head.bias)
        return torch.stack([logp, ent], dim=-1)

    head.forward = forward  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del head.forward
