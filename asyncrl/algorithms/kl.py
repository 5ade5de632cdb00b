"""Per-token KL estimators, KL coefficient controllers, and the KL-in-reward penalty.

Estimators of KL(pi || pi_ref) from one sample, with log-ratio x = logprob - ref_logprob
(J. Schulman, "Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html):
- `k1` / `kl`:          x                      unbiased value, wrong gradient in expectation
- `abs`:                |x|
- `k2` / `mse`:         x^2 / 2                 biased value, gradient of the true KL
- `k3` / `low_var_kl`:  exp(-x) + x - 1         unbiased, low variance, clamped to [-10, 10]
A trailing `+` (e.g. `k3+`) is the straight-through form: the value of the named estimator, the
gradient of k2 (arXiv:2505.17508, verl's "+" suffix).

Not here: where the KL goes (reward or loss) is the trainer's choice; the KL loss term is just
`agg_loss(kl_penalty(...), mask, mode)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.algorithms.agg import masked_mean
from asyncrl.config.names import KLKind, choices

_BASE_KINDS: tuple[str, ...] = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_PENALTY_KINDS: tuple[str, ...] = _BASE_KINDS + tuple(k + "+" for k in _BASE_KINDS)
assert KL_PENALTY_KINDS == choices(KLKind), "name the kind in asyncrl.config.names.KLKind"


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kind: str) -> Tensor:
    """Elementwise KL estimate (B, T) of `kind` (see the module docstring).

    Example with logprob = -1.0, ref_logprob = -1.5 (x = 0.5):
        k1 = 0.5, abs = 0.5, k2 = 0.125, k3 = exp(-0.5) + 0.5 - 1 = 0.106531;
        k3+ has value 0.106531 and d/d(logprob) = x = 0.5 (k2's gradient).
    """
    if kind not in KL_PENALTY_KINDS:
        raise ValueError(f"unknown KL penalty {kind!r}; choose one of {KL_PENALTY_KINDS}")
    if not kind.endswith("+"):
        return _kl_forward(logprob, ref_logprob, kind)
    value = _kl_forward(logprob, ref_logprob, kind[:-1]).detach()
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value


def _kl_forward(logprob: Tensor, ref_logprob: Tensor, kind: str) -> Tensor:
    """The plain estimators, no straight-through."""
    log_ratio = logprob - ref_logprob  # (B, T)
    if kind in ("k1", "kl"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("k2", "mse"):
        return 0.5 * log_ratio.square()
    # k3: r - log r - 1 with r = pi_ref / pi; clamps as in verl for numerical safety.
    neg = (-log_ratio).clamp(min=-20.0, max=20.0)
    return (neg.exp() - neg - 1.0).clamp(min=-10.0, max=10.0)


class FixedKLController:
    """A constant KL coefficient. Example: FixedKLController(0.001).value == 0.001 forever."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers are interchangeable)."""


class AdaptiveKLController:
    """Proportional controller of the KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, §2.2).

    e = clip(current_kl / target_kl - 1, -0.2, 0.2);  value <- value * (1 + e * n_steps / horizon).
    Example: init 0.1, target 0.01, horizon 100: update(0.02, n_steps=10) gives e = 0.2 (clipped
    from 1.0) and value = 0.1 * 1.02 = 0.102.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        assert horizon > 0 and target_kl > 0, "horizon and target_kl must be positive"
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward keeping the observed KL at `target_kl`."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def apply_kl_in_reward(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[Tensor, dict[str, float]]:
    """token_level_rewards = scores - kl_coef * KL_kind(old || ref), 0 at masked tokens.

    Metrics: `actor/reward_kl_penalty` is the batch mean of each sequence's mean token KL (the
    value to feed `controller.update(current_kl, n_steps=B)`), `actor/reward_kl_penalty_coeff`
    is `kl_coef`. Example: scores [[0, 1]], old [[-1, -1]], ref [[-1.5, -2]], coef 0.1, k1:
    KL = [[0.5, 1.0]], rewards [[-0.05, 0.9]], reward_kl_penalty = 0.75.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        kld = torch.where(mask, kl_penalty(old_log_prob, ref_log_prob, kind), 0.0)  # (B, T)
        rewards = torch.where(mask, token_level_scores - kl_coef * kld, 0.0)
        current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_coef}
    return rewards, metrics
