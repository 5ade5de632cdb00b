"""Policy-gradient losses: per-token surrogate, looked up by name, aggregated by `agg_loss`.

Each registry entry maps (old_log_prob, log_prob, advantages, response_mask, clip settings) to
(loss_mat (B, T), clipped (B, T) bool, clipped_lower (B, T) bool). `compute_policy_loss` does the
rest once for all of them: masking, off-policy weights, aggregation, metrics. Masked positions
are zeroed on entry, so their content (even NaN) never reaches a result or a gradient.

`old_log_prob` is whatever the ratio is taken against: the behaviour policy's log-probs (the
rollout engine's, `use_rollout_log_probs`) or a recomputed proximal policy's; in the decoupled
form the behaviour -> proximal correction enters as `is_weights` (see `off_policy.py`).

Metrics are detached 0-dim tensors on the inputs' device, not floats: a trainer sums them over
micro-batches and reads them once per step, instead of waiting for the device at every call.

Not here: the entropy bonus and the KL loss (add `agg_loss(...)` terms in the trainer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from asyncrl.algorithms.agg import agg_loss, masked_mean
from asyncrl.config.names import PolicyLossName, choices

PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, float, float, float], tuple[Tensor, Tensor, Tensor]]

# log-ratio clamp before exp(), as verl: keeps exp finite for wildly stale tokens.
_LOG_RATIO_CLAMP = 20.0


def _log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    return (log_prob - old_log_prob).clamp(min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)


def vanilla(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
            clip_ratio_low: float, clip_ratio_high: float,
            clip_ratio_c: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) with clip-higher
    (DAPO, arXiv:2503.14476, eq. 10) and dual-clip for A < 0 (Ye et al. 2020, arXiv:1912.09729).

    L = max(-A r, -A clip(r, 1 - lo, 1 + hi)); for A < 0, L = min(L, -A c).
    Example (lo = hi = 0.2, c = 3): r = 1.5, A = 1 -> 1.2 * -1 = -1.2 (clipped);
    r = 5, A = -1 -> min(5, 3) = 3 (dual-clipped); r = 0.5, A = 1 -> -0.5.
    """
    assert clip_ratio_c > 1.0, f"clip_ratio_c must be > 1 for dual-clip, got {clip_ratio_c}"
    ratio = _log_ratio(log_prob, old_log_prob).exp()  # (B, T)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -advantages * clip_ratio_c)
    negative = advantages < 0
    clipped_lower = negative & (loss_ppo > -advantages * clip_ratio_c)
    loss_mat = torch.where(negative, loss_dual, loss_ppo)
    return loss_mat, loss_clipped > loss_unclipped, clipped_lower


def gspo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
         clip_ratio_low: float, clip_ratio_high: float,
         clip_ratio_c: float) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071, eq. 13-14): sequence-level ratio
    s_i = exp(mean_t log r_it), used token-wise as s_it = sg[s_i] * pi_t / sg[pi_t].

    The value of s_it is s_i; its gradient is s_i * grad log pi_t. Clipped like PPO (no dual
    clip). Example: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.221403; with A = 1, hi = 0.2 ->
    loss -1.2 on both tokens (clipped). Always aggregated seq-mean-token-mean (the paper's
    1/G sum_i 1/|y_i| sum_t), whatever `loss_agg_mode` says, as verl does.
    """
    mask = response_mask.bool()
    seq_log_ratio_B = torch.where(mask, log_prob - old_log_prob, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = log_prob - log_prob.detach() + seq_log_ratio_B.detach().unsqueeze(-1)  # (B, T)
    s = log_s.clamp(max=10.0).exp()
    loss_unclipped = -advantages * s
    loss_clipped = -advantages * s.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    return loss_mat, loss_clipped > loss_unclipped, torch.zeros_like(mask)


def cispo(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
          clip_ratio_low: float, clip_ratio_high: float,
          clip_ratio_c: float) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4-5): L = -sg[clip(r, 1 - lo, 1 + hi)] A log pi.

    Clipping the IS weight rather than the update keeps every token's gradient.
    Example: r = 1.5 (hi = 0.2), A = 1, log pi = -2 -> L = -1.2 * 1 * -2 = 2.4, dL/dlog pi = -1.2.
    `clipped` marks either bound; `clipped_lower` the lower one.
    """
    ratio = _log_ratio(log_prob, old_log_prob).exp().detach()  # (B, T)
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = -weight * advantages * log_prob
    return loss_mat, weight != ratio, ratio < 1.0 - clip_ratio_low


def gpg(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
        clip_ratio_low: float, clip_ratio_high: float,
        clip_ratio_c: float) -> tuple[Tensor, Tensor, Tensor]:
    """GPG (Chu et al. 2025, arXiv:2504.02546, eq. 6): L = -A log pi, no ratio, no clipping.

    Example: A = 2, log pi = -0.5 -> L = 1.0.
    """
    no_clip = torch.zeros_like(response_mask, dtype=torch.bool)
    return -advantages * log_prob, no_clip, no_clip


POLICY_LOSSES: dict[PolicyLossName, PolicyLossFn] = {"vanilla": vanilla, "gspo": gspo, "cispo": cispo, "gpg": gpg}
POLICY_LOSS_NAMES: tuple[str, ...] = tuple(POLICY_LOSSES)
assert POLICY_LOSS_NAMES == choices(PolicyLossName), "register the name in asyncrl.config.names"
_FORCED_AGG_MODE: dict[str, str] = {"gspo": "seq-mean-token-mean"}


def compute_policy_loss(
    name: PolicyLossName,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    is_weights: Tensor | None = None,
    norm_length: float | None = None,
    global_token_count: float | None = None,
    global_seq_count: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy loss `name` -> (scalar loss, metrics as detached 0-dim tensors); all inputs (B, T).

    `is_weights` (e.g. truncated behaviour -> proximal IS weights) multiply the per-token loss
    under stop-gradient. Metrics: `actor/pg_loss`, `actor/pg_clipfrac` (tokens whose clipped
    term was taken), `actor/ppo_kl` (mean of old - new log-prob), `actor/pg_clipfrac_lower`
    (dual-clipped tokens; for cispo, tokens below 1 - lo), all over unmasked tokens. With the
    global counts set, the loss and `actor/pg_loss` are this micro-batch's share of the total.
    Example: vanilla, ratios [[1.5, 5.0]], A [[1, -1]] -> per token [-1.2, 3.0], token-mean 0.9,
    pg_clipfrac 0.5, pg_clipfrac_lower 0.5. With ratio 1 everywhere, loss = -mean(A).
    """
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown actor.policy_loss {name!r}; choose one of {POLICY_LOSS_NAMES}")
    mask = response_mask.bool()
    old_log_prob, log_prob, advantages = (torch.where(mask, x, 0.0) for x in (old_log_prob, log_prob, advantages))
    loss_mat, clipped, clipped_lower = POLICY_LOSSES[name](
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    if is_weights is not None:
        loss_mat = loss_mat * torch.where(mask, is_weights.detach(), 0.0)
    loss = agg_loss(
        loss_mat, response_mask, _FORCED_AGG_MODE.get(name, loss_agg_mode), norm_length=norm_length,
        global_token_count=global_token_count, global_seq_count=global_seq_count,
    )
    return loss, _metrics(loss, old_log_prob, log_prob, clipped, clipped_lower, response_mask)


def _metrics(loss: Tensor, old_log_prob: Tensor, log_prob: Tensor, clipped: Tensor,
             clipped_lower: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """The four scalar metrics, detached 0-dim tensors (no host read)."""
    with torch.no_grad():
        return {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": masked_mean(clipped.float(), response_mask),
            "actor/ppo_kl": masked_mean(old_log_prob - log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(clipped_lower.float(), response_mask),
        }
