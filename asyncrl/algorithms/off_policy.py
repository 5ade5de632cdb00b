"""Importance weights that correct stale (off-policy) samples: behaviour -> proximal policy.

Decoupled PPO (Hilton et al. 2022, arXiv:2110.00641; AReaL, arXiv:2505.24298, eq. 5) splits the
PPO ratio pi_theta / pi_behav into a clipped trust-region ratio pi_theta / pi_prox (the policy
loss, with `old_log_prob = proximal_log_prob`) times a non-clipped, truncated behaviour weight
pi_prox / pi_behav (this module, passed as `is_weights`). verl's rollout importance sampling (TIS)
uses the same weights to correct the rollout-engine / trainer mismatch.

Truncation, capped at `cap` (default 2.0):
- `level="token"`:    w_t = min(exp(prox_t - behav_t), cap)
- `level="sequence"`: w   = min(exp(sum_t (prox_t - behav_t)), cap), broadcast to every token.
`drop_above_cap=True` gives AReaL's variant: a weight above the cap becomes 0 instead of `cap`.
Masked tokens get weight 0. Weights carry no gradient.

Not here: recomputing the proximal log-probs (the trainer's forward pass).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.algorithms.agg import masked_mean

IS_LEVELS: tuple[str, ...] = ("token", "sequence")


def truncated_is_weights(
    proximal_log_prob: Tensor,
    behaviour_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    cap: float = 2.0,
    drop_above_cap: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance weights (B, T) and metrics; see the module docstring.

    Metrics `off_policy/is_weight_mean` (mean weight after truncation) and
    `off_policy/is_truncated_frac` (share above the cap), both over unmasked tokens for
    `token`, over non-empty sequences for `sequence`.
    Example: prox - behav = [[0.0, 1.0, -0.5]], cap 2: token -> [[1.0, 2.0, 0.606531]]
    (exp(1) = 2.718 truncated, frac 1/3); sequence -> exp(0.5) = 1.648721 on all 3 tokens.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; choose one of {IS_LEVELS}")
    assert cap > 0, f"cap must be positive, got {cap}"
    with torch.no_grad():
        mask = response_mask.bool()
        log_w = torch.where(mask, proximal_log_prob - behaviour_log_prob, 0.0)  # (B, T)
        if level == "sequence":
            log_w = log_w.sum(dim=-1, keepdim=True)  # (B, 1)
        truncated = log_w > math.log(cap)
        fill = 0.0 if drop_above_cap else cap
        w = torch.where(truncated, fill, log_w.clamp(max=math.log(cap)).exp())
        weights = torch.where(mask, w.expand_as(mask), 0.0)  # (B, T)
        metrics = _metrics(w, truncated, mask, level)
    return weights, metrics


def _metrics(w: Tensor, truncated: Tensor, mask: Tensor, level: str) -> dict[str, float]:
    """Mean weight and truncated share over tokens (token level) or non-empty sequences."""
    unit_mask = mask if level == "token" else mask.any(dim=-1, keepdim=True)
    return {
        "off_policy/is_weight_mean": masked_mean(w, unit_mask).item(),
        "off_policy/is_truncated_frac": masked_mean(truncated.to(w.dtype), unit_mask).item(),
    }
