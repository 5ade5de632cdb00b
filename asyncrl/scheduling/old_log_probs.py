"""Where PPO's old log-probs come from, decided once per run from a few settings. Pure; shared by
the trainer, the worker factory and the simulator (which charges a forward pass exactly when the
real trainer runs one).
"""

from __future__ import annotations

from typing import Literal

OldLogProbSource = Literal["recompute", "rollout", "proximal", "update"]
"""recompute: a forward pass before the update; rollout: the engine's behaviour log-probs;
proximal: a recomputed proximal policy with truncated importance weights (decoupled PPO);
update: the update's own forward, detached (exact when each batch is one optimizer step)."""
PASS_SOURCES: tuple[OldLogProbSource, ...] = ("recompute", "proximal")
"""The sources that cost a forward pass before the update."""


def old_log_prob_source(choice: str, *, colocated: bool, one_step: bool, kl_in_reward: bool,
                        exact_rollout: bool, use_rollout_log_probs: bool,
                        off_policy_correction: str) -> OldLogProbSource:
    """The source for a run.

    Colocated (on-policy) follows `choice` (`actor.old_log_probs`); its `auto` takes, without a
    pass of its own: "update" when each batch is `one_step` optimizer step and no KL-in-reward
    needs them first; else "rollout" when `exact_rollout` (the engine computes log-probs as the
    trainer does, e.g. float32 on CPU: they differ by float rounding); else "recompute".
    Decoupled: the engine's behaviour log-probs when `use_rollout_log_probs`, else a recomputed
    proximal policy when an `off_policy_correction` is set, else a plain recompute.

    Example: colocated, choice "auto", one_step, no KL in reward -> "update"; decoupled,
    use_rollout_log_probs False, correction "token" -> "proximal"."""
    if colocated:
        if choice in ("recompute", "rollout"):
            return "recompute" if choice == "recompute" else "rollout"
        assert choice == "auto", choice
        if one_step and not kl_in_reward:
            return "update"
        return "rollout" if exact_rollout else "recompute"
    if use_rollout_log_probs:
        return "rollout"
    return "recompute" if off_policy_correction == "none" else "proximal"
