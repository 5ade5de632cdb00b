"""The names a config choice takes, defined once as `Literal` types: the schema's fields are typed
with them (so validation, `asyncrl config`'s docs and the error messages list them), and each
registry is keyed by exactly them (the registry's module asserts so at import, or types its keys
with the alias).

Imports only `typing`, so `asyncrl.config` stays light (no torch, no transformers) and the pure
core can take its key types from here without pulling anything else in.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

Pipeline = Literal["colocated", "one_step_off", "fully_async"]
"""`pipeline=`: `asyncrl.pipelines.PIPELINE_MODULES`."""
Backend = Literal["local", "ray", "processes"]
"""`backend=`: the substrates a real run can use (`asyncrl.substrates`); `asyncrl sim` adds "sim"."""
Engine = Literal["torch"]
"""`rollout.engine=`: `asyncrl.rollout.registry.ENGINES`."""
Device = Literal["cpu", "cuda"]
Dtype = Literal["float32", "bfloat16"]
Task = Literal["arithmetic", "countdown", "code", "longtail", "long_addition"]
"""`data.task=`: the built-in generated tasks (`asyncrl.data.tasks`)."""
Truncation = Literal["error", "left", "right", "middle"]
"""`data.truncation=`: an overlong prompt when not filtered (`asyncrl.data.dataset.fit_prompts`)."""
Gsm8kMethod = Literal["strict", "flexible", "auto"]
"""`reward.gsm8k_method=`: how the built-in GSM8K scorer finds the answer (`asyncrl.rewards.math_rewards`)."""
Logger = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow", "swanlab"]

AdvEstimatorName = Literal["gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus",
                           "reinforce_plus_plus_baseline", "opo", "gpg", "remax"]
"""`algorithm.adv_estimator=`: `asyncrl.algorithms.advantages.ADV_ESTIMATORS`."""
GROUP_ESTIMATORS: tuple[AdvEstimatorName, ...] = ("grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline",
                                                  "opo", "gpg")
"""Estimators that compare responses within a group (they need rollout.n >= 2)."""
SYNC_ONLY_ESTIMATORS: tuple[AdvEstimatorName, ...] = ("gae", "remax")
"""Estimators that need a critic pass or an extra generation inside the step: colocated only."""
PolicyLossName = Literal["vanilla", "gspo", "cispo", "gpg"]
"""`actor.policy_loss=`: `asyncrl.algorithms.policy_loss.POLICY_LOSSES`."""
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""`actor.loss_agg_mode=`: `asyncrl.algorithms.agg`."""
KLKind = Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl",
                 "k1+", "kl+", "abs+", "k2+", "mse+", "k3+", "low_var_kl+"]
"""KL estimators (`asyncrl.algorithms.kl`); `+` takes the value of one and the gradient of k2."""
KLControl = Literal["fixed", "adaptive"]
LRSchedule = Literal["constant", "cosine"]
OldLogProbs = Literal["auto", "recompute", "rollout"]
"""`actor.old_log_probs=`; the resolved source is `asyncrl.scheduling.old_log_probs.OldLogProbSource`."""
OffPolicyCorrection = Literal["none", "token", "sequence"]
VersionLagPolicy = Literal["drop", "pace"]
"""`async_training.version_lag_policy=`: what `max_version_lag` does with a group that would pass it."""
SandboxBackend = Literal["auto", "bwrap", "rlimit", "http"]
PackedAttention = Literal["auto", "varlen", "jagged", "grouped"]
"""`model.packed_attention=`: the kernel for packed rows (`asyncrl.training.packed_attention.choose`)."""
MixedPrecision = Literal["auto", "param_dtype", "autocast"]
"""`model.mixed_precision=`: `asyncrl.scheduling.precision_path.precision_path` resolves it."""
DecodeAttention = Literal["auto", "matmul", "triton"]
"""`rollout.decode_attention=`: the engine's decode attention (`asyncrl.rollout.attention.resolve`)."""
FusedDecode = Literal["auto", "on", "off"]
"""`rollout.fused_decode=`: `asyncrl.rollout.kernels.use_fused_decode` resolves it."""
PackedPrefill = Literal["auto", "off"]
"""`rollout.packed_prefill=`: auto = `asyncrl.rollout.prefill.prefill_path` picks; off = padded."""
ToolCallFormat = Literal["hermes", "compact"]
"""`rollout.multi_turn.format=`: hermes = `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (verl's
default, Qwen's templates); compact = `<tool_call>NAME ARGUMENT</tool_call>` (the tiny-tools model)."""
KeepSlot = Literal["release", "keep"]
"""`rollout.multi_turn.keep_slot=`: during a tool call the episode's KV slot is released to the prefix
cache (release) or kept for its next turn (keep)."""


def choices(literal: Any) -> tuple[str, ...]:
    """The values of a `Literal` alias, in order: `choices(KLControl) == ("fixed", "adaptive")`."""
    return get_args(literal)


PIPELINES = choices(Pipeline)
BACKENDS = choices(Backend)
ENGINES = choices(Engine)
