"""Masked reductions and loss aggregation over (B, T) response-token matrices.

Every function here reads only the unmasked entries: whatever sits at a masked position (padding,
prompt, NaN) never changes a result. Masks are 0/1 (bool, int or float).

Aggregation modes (verl's `loss_agg_mode`):
- `token-mean`: every response token of the batch weighs the same (DAPO, arXiv:2503.14476).
- `seq-mean-token-sum`: sum over a sequence's tokens, mean over sequences.
- `seq-mean-token-mean`: mean over a sequence's tokens, mean over sequences (original GRPO).
- `seq-mean-token-sum-norm`: token sum divided by a constant `norm_length` (default: T), mean over
  sequences; Dr.GRPO's length-unbiased normaliser (arXiv:2503.20783, "MAX_TOKENS").

"Mean over sequences" counts only sequences with at least one unmasked token. For micro-batching,
pass `global_token_count` / `global_seq_count` (the counts over the whole mini-batch): the
micro-batch losses then add up exactly to the mini-batch loss.

Not here: distributed all-reduce of those counts (the trainer's job).
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.config.names import LossAggMode, choices

LOSS_AGG_MODES: tuple[str, ...] = choices(LossAggMode)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is 1, over `dim` (all dims when None).

    Example: masked_sum([[1., 2., 9.]], [[1, 1, 0]]) = 3.0; masked positions may hold NaN.
    """
    picked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where `mask` is 1; 0 where nothing is unmasked.

    Example: masked_mean([[1., 2., 9.]], [[1, 1, 0]]) = 1.5.
    """
    count = mask.to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the unmasked entries (Bessel-corrected when `unbiased`); 0 for one entry.

    Example: masked_var([[1., 2., 3., 9.]], [[1, 1, 1, 0]]) = 1.0 (biased: 2/3).
    """
    centered = values - masked_mean(values, mask)
    var = masked_mean(centered.square(), mask)
    if not unbiased:
        return var
    n = mask.to(values.dtype).sum()
    return var * n / (n - 1.0).clamp(min=1.0)


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the unmasked entries; 0 at masked positions.

    Uses the unbiased variance, as verl does. With `shift_mean=False` the mean is added back.
    Example: masked_whiten([[1., 2., 3., 9.]], [[1, 1, 1, 0]]) = [[-1., 0., 1., 0.]] (up to 1e-8).
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    norm_length: float | None = None,
    global_token_count: float | None = None,
    global_seq_count: float | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar according to `mode` (see the module docstring).

    `norm_length` is the constant of `seq-mean-token-sum-norm` (default: T = loss_mat.shape[-1]).
    `global_token_count` / `global_seq_count` replace the local counts (micro-batching).

    Example: loss_mat = [[1, 2, 3], [4, 0, 0]], mask = [[1, 1, 1], [1, 0, 0]]:
        token-mean               (1+2+3+4)/4       = 2.5
        seq-mean-token-sum       (6+4)/2           = 5.0
        seq-mean-token-mean      (2+4)/2           = 3.0
        seq-mean-token-sum-norm  (6+4)/2/3         = 1.6667   (norm_length=10 -> 0.5)
    """
    if mode == "token-mean":
        local_count = mask.to(loss_mat.dtype).sum()
        return masked_sum(loss_mat, mask) / _count(local_count, global_token_count)
    seq_losses_B = _seq_losses(loss_mat, mask, mode, norm_length)
    local_count = (mask.sum(dim=-1) > 0).to(loss_mat.dtype).sum()
    return seq_losses_B.sum() / _count(local_count, global_seq_count)


def _count(local: Tensor, override: float | None) -> Tensor | float:
    """The denominator: the local count, or the caller's global one; never below 1."""
    return local.clamp(min=1.0) if override is None else max(float(override), 1.0)


def _seq_losses(loss_mat: Tensor, mask: Tensor, mode: str, norm_length: float | None) -> Tensor:
    """Per-sequence loss (B,) for the `seq-mean-*` modes; 0 for an empty sequence."""
    token_sum_B = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return token_sum_B
    if mode == "seq-mean-token-mean":
        return token_sum_B / mask.to(loss_mat.dtype).sum(dim=-1).clamp(min=1.0)
    if mode == "seq-mean-token-sum-norm":
        return token_sum_B / float(loss_mat.shape[-1] if norm_length is None else norm_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")
