"""PPO critic loss with value clipping.

Not here: the value head or the returns (see `advantages.gae`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.algorithms.agg import agg_loss, masked_mean


def compute_value_loss(
    vpreds: Tensor,
    values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    norm_length: float | None = None,
    global_token_count: float | None = None,
    global_seq_count: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss 0.5 * agg(max((v - R)^2, (clip(v, V - c, V + c) - R)^2)).

    PPO's value clipping (as in OpenAI baselines / verl; Schulman et al. 2017, arXiv:1707.06347).
    `vpreds` are the critic's current predictions, `values` the ones recorded at rollout time,
    `returns` the targets. Note the argument order (verl's is vpreds, returns, values).
    Metrics: `critic/vf_loss`, `critic/vf_clipfrac` (tokens where the clipped term was larger), as
    detached 0-dim tensors (a trainer reads them once per step, not per call).
    Example: vpred 2.0, value 1.0, return 1.0, c = 0.5: clip -> 1.5; max(1.0, 0.25) = 1.0;
    loss 0.5, clipfrac 0. With return 3.0: max(1.0, 2.25) = 2.25; loss 1.125, clipfrac 1.
    """
    mask = response_mask.bool()
    vpreds, values, returns = (torch.where(mask, x, 0.0) for x in (vpreds, values, returns))
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns).square()  # (B, T)
    loss_clipped = (vpred_clipped - returns).square()
    loss = 0.5 * agg_loss(
        torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode,
        norm_length=norm_length, global_token_count=global_token_count, global_seq_count=global_seq_count,
    )
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": clipfrac}
