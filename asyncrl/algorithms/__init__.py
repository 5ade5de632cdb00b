"""The pure RL core: advantage estimators, policy/value losses, KL, aggregation, log-probs.

Pure functions over (B, T) response-token tensors plus a mask, looked up by name in
registries keyed by the config's `Literal` names (`asyncrl.config.names`, which imports only
`typing`). The trainer passes the batch's loss mask (`TrainBatch.loss_mask`): the model's own
tokens, so a multi-turn episode's tool text (attended context, no behaviour log-prob) enters
no loss, KL, entropy, ratio or advantage; whatever sits at a masked position changes nothing.
No config objects, no devices, no I/O; nothing else from the rest of asyncrl.
"""

from asyncrl.algorithms.advantages import (
    ADV_ESTIMATOR_NAMES,
    ADV_ESTIMATORS,
    NEEDS_CRITIC,
    NEEDS_REWARD_BASELINES,
    compute_advantage,
)
from asyncrl.algorithms.agg import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten
from asyncrl.algorithms.kl import (
    KL_PENALTY_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_in_reward,
    kl_penalty,
)
from asyncrl.algorithms.logprobs import entropy_from_logits, logprobs_from_logits
from asyncrl.algorithms.off_policy import IS_LEVELS, truncated_is_weights
from asyncrl.algorithms.policy_loss import POLICY_LOSS_NAMES, POLICY_LOSSES, compute_policy_loss
from asyncrl.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATORS", "ADV_ESTIMATOR_NAMES", "IS_LEVELS", "KL_PENALTY_KINDS", "LOSS_AGG_MODES",
    "NEEDS_CRITIC", "NEEDS_REWARD_BASELINES", "POLICY_LOSSES", "POLICY_LOSS_NAMES",
    "AdaptiveKLController", "FixedKLController", "KLController", "agg_loss", "apply_kl_in_reward",
    "compute_advantage", "compute_policy_loss", "compute_value_loss", "entropy_from_logits",
    "kl_penalty", "logprobs_from_logits", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "truncated_is_weights",
]
