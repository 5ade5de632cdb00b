"""Token log-probabilities and entropies from logits, without a (B, T, V) log-softmax.

Both functions are custom autograd functions that work row-chunk by row-chunk: the forward keeps
only the logits themselves (which the caller holds anyway) plus (B, T) row statistics; the
backward recomputes each chunk's softmax and writes straight into the (B, T, V) logits gradient.
Peak extra memory is one chunk of `chunk_rows x V` in the compute dtype, instead of a full
float32 log-softmax kept for backward. A non-contiguous (B, T, V) slice of the model's output
(`logits[:, P - 1 : P - 1 + T]`) is used in place, not copied. Math runs in at least float32
(float64 stays float64), so do not `.float()` bf16 logits first: that upcast copy is a full
float32 (B, T, V) tensor that autograd keeps. Outputs are in the compute dtype, gradients in
the logits' dtype.

Temperature convention: logits are divided by `temperature` before the softmax, exactly as the
rollout engine must do when it reports behaviour log-probs (vLLM and SGLang do: they sample from
softmax(logits / T) and return the log-probs of that distribution). A mismatch here makes every
importance ratio wrong.

Not here: slicing the response part out of the full-sequence logits (the model wrapper's job).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

DEFAULT_CHUNK_ROWS = 1024

Block = tuple[slice, slice]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _blocks(shape_BT: torch.Size, chunk_rows: int) -> list[Block]:
    """(batch slice, position slice) blocks of about `chunk_rows` rows each; slicing (B, T, V)
    logits by them is a view even when the logits are a non-contiguous slice of the model output."""
    batch, length = shape_BT
    if batch == 0 or length == 0:
        return []
    if length >= chunk_rows:
        return [(slice(b, b + 1), slice(t, t + chunk_rows)) for b in range(batch) for t in range(0, length, chunk_rows)]
    step = chunk_rows // length
    return [(slice(b, b + step), slice(None)) for b in range(0, batch, step)]


class _LabelLogProb(torch.autograd.Function):
    """log softmax(logits / tau)[label] for (B, T, V) logits and (B, T) labels."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        dtype = _compute_dtype(logits.dtype)
        out = torch.empty(labels.shape, dtype=dtype, device=logits.device)  # (B, T)
        lse = torch.empty_like(out)
        for blk in _blocks(labels.shape, chunk_rows):
            x = logits[blk].to(dtype) / temperature
            lse[blk] = torch.logsumexp(x, dim=-1)
            out[blk] = x.gather(-1, labels[blk].unsqueeze(-1)).squeeze(-1) - lse[blk]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        # d/dx_j log p_label = onehot_j - p_j, and x = logits / tau.
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V)
        for blk in _blocks(labels.shape, ctx.chunk_rows):
            x = logits[blk].to(lse.dtype) / ctx.temperature
            g = -(x - lse[blk].unsqueeze(-1)).exp()
            g.scatter_add_(-1, labels[blk].unsqueeze(-1), torch.ones_like(g[..., :1]))
            grad[blk] = g * (grad_out[blk] / ctx.temperature).unsqueeze(-1)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """Entropy of softmax(logits / tau) for (B, T, V) logits."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, temperature: float, chunk_rows: int) -> Tensor:
        dtype = _compute_dtype(logits.dtype)
        ent = torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device)  # (B, T)
        lse = torch.empty_like(ent)
        for blk in _blocks(ent.shape, chunk_rows):
            x = logits[blk].to(dtype) / temperature
            lse[blk] = torch.logsumexp(x, dim=-1)
            p = (x - lse[blk].unsqueeze(-1)).exp()
            ent[blk] = lse[blk] - (p * x).sum(-1)
        ctx.save_for_backward(logits, lse, ent)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        # dH/dx_j = -p_j (x_j - E_p[x]), with E_p[x] = lse - H.
        logits, lse, ent = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V)
        for blk in _blocks(ent.shape, ctx.chunk_rows):
            x = logits[blk].to(lse.dtype) / ctx.temperature
            p = (x - lse[blk].unsqueeze(-1)).exp()
            g = -p * (x - (lse[blk] - ent[blk]).unsqueeze(-1))
            grad[blk] = g * (grad_out[blk] / ctx.temperature).unsqueeze(-1)
        return grad, None, None


def _as_3d(logits: Tensor) -> Tensor:
    """(..., T, V) -> (N, T, V) without copying a (B, T, V) slice; (T, V) -> (1, T, V)."""
    return logits.reshape(math.prod(logits.shape[:-2]), *logits.shape[-2:])


def logprobs_from_logits(
    logits: Tensor, labels: Tensor, temperature: float = 1.0, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> Tensor:
    """log softmax(logits / temperature)[labels]: (B, T, V), (B, T) -> (B, T).

    Equal in value and gradient to `torch.log_softmax(logits / t, -1).gather(-1, labels[..., None])`
    without materialising the log-softmax. Any leading shape works ((..., T, V) with (..., T)).
    Example: logits [[[0, ln 3]]] (p = [0.25, 0.75]), label 1 -> log 0.75 = -0.287682;
    temperature 2 -> p_1 = sqrt 3 / (1 + sqrt 3) -> -0.455746.
    """
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    assert logits.shape[:-1] == labels.shape, f"logits {tuple(logits.shape)} vs labels {tuple(labels.shape)}"
    assert logits.dim() >= 2, "logits need a position and a vocabulary dimension"
    labels_3d = labels.reshape(_as_3d(logits).shape[:-1]).long()
    out: Tensor = _LabelLogProb.apply(_as_3d(logits), labels_3d, temperature, chunk_rows)
    return out.view(labels.shape)


def entropy_from_logits(
    logits: Tensor, temperature: float = 1.0, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> Tensor:
    """Entropy of softmax(logits / temperature) per position: (B, T, V) -> (B, T).

    H = logsumexp(x) - sum_v p_v x_v with x = logits / temperature; gradient matches autograd
    through `torch.distributions.Categorical(logits=x).entropy()`.
    Example: logits [[[0, ln 3]]] (p = [0.25, 0.75]) -> H = 0.562335 nats.
    """
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    assert logits.dim() >= 2, "logits need a position and a vocabulary dimension"
    ent: Tensor = _Entropy.apply(_as_3d(logits), temperature, chunk_rows)
    return ent.view(logits.shape[:-1])
