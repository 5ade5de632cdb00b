"""The PPO/GRPO training step on finished groups, shared by every pipeline.

Pipelines differ in how groups are produced (colocated, one-step-off, streamed); what happens
to a batch of groups does not: old log-probs → reference log-probs → values → KL-in-reward →
advantages → critic update → actor update, each a named timed stage.

Old log-probs come from one of three sources (`old_log_prob_source`):
- "recompute": the actor's current weights (verl's colocated default; on-policy);
- "rollout": the engine's behaviour log-probs (`async_training.use_rollout_log_probs`);
- "proximal": recomputed proximal policy plus truncated importance weights behaviour →
  proximal (AReaL's decoupled PPO; `actor.off_policy_correction`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from asyncrl.algorithms.advantages import compute_advantage
from asyncrl.algorithms.agg import masked_mean
from asyncrl.algorithms.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward
from asyncrl.algorithms.off_policy import truncated_is_weights
from asyncrl.config_schema import AlgorithmConfig
from asyncrl.scheduling.batching import num_mini_batches
from asyncrl.sync import TrainerWeights, WeightMeta
from asyncrl.telemetry.metrics import masked_stats, timer
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.critic import Critic
from asyncrl.types import Group
from asyncrl.workers.handles import blocking


class PPOTrainer:
    """`asyncrl.roles.TrainerSide` over an actor (+ reference, + critic). Its blocking methods
    run on its own worker thread (`num_threads` torch threads; 0 = the caller's count)."""

    def __init__(self, actor: Actor, algorithm: AlgorithmConfig, *, pad_id: int,
                 ref: RefWorker | None = None, critic: Critic | None = None,
                 old_log_prob_source: str = "recompute", num_threads: int = 0) -> None:
        assert old_log_prob_source in ("recompute", "rollout", "proximal")
        self.num_threads = num_threads
        self.actor, self.ref, self.critic = actor, ref, critic
        self.algorithm = algorithm
        self.pad_id = pad_id
        self.old_log_prob_source = old_log_prob_source
        self.weights = TrainerWeights(actor.model)
        kl = algorithm.kl_ctrl
        self.kl_ctrl = (AdaptiveKLController(kl.kl_coef, kl.target_kl, kl.horizon)
                        if kl.type == "adaptive" else FixedKLController(kl.kl_coef))

    def train(self, groups: Sequence[Group], metrics: dict[str, float]) -> dict[str, float]:
        """One update on these groups; stage timings and results go into `metrics`."""
        minis = num_mini_batches(len(groups), self.actor.cfg.ppo_mini_batch_size)
        batch = build_batch(groups, self.pad_id)
        self._old_log_probs(batch, metrics)
        if self.ref is not None:
            with timer("ref", metrics):
                batch.ref_log_probs = self.ref.compute_log_probs(batch)
        if self.critic is not None:
            with timer("values", metrics):
                batch.values = self.critic.compute_values(batch)
        with timer("adv", metrics):
            self._advantages(batch, groups, metrics)
        if self.critic is not None:
            with timer("update_critic", metrics):
                metrics |= self.critic.train_step(batch, minis)
        with timer("update_actor", metrics):
            metrics |= self.actor.train_step(batch, minis)
        return metrics

    @blocking
    def train_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """`train` on the worker thread: returns its own metrics."""
        return self.train(groups, {})

    # The trainer's half of weight sync (asyncrl.roles.WeightSource), called between updates.
    async def weight_meta(self) -> list[WeightMeta]:
        return await self.weights.weight_meta()

    async def export_weights(self) -> dict[str, torch.Tensor]:
        """The actor's tensors by name, uncopied (the receiver copies)."""
        return await self.weights.export_weights()

    async def weights_checksum(self) -> str:
        return await self.weights.weights_checksum()

    async def broadcast_weights(self, group_name: str, bucket_mb: float) -> int:
        return await self.weights.broadcast_weights(group_name, bucket_mb)

    @blocking
    def save(self, path: Path) -> None:
        """Actor (HF format + optimizer), critic, KL coefficient under `path`."""
        self.actor.save(path / "actor")
        if self.critic is not None:
            self.critic.save(path / "critic")
        (path / "trainer.json").write_text(json.dumps({"kl_coef": self.kl_ctrl.value}))

    @blocking
    def load(self, path: Path) -> None:
        self.actor.load(path / "actor")
        if self.critic is not None:
            self.critic.load(path / "critic")
        self.kl_ctrl.value = json.loads((path / "trainer.json").read_text())["kl_coef"]

    def _old_log_probs(self, batch: TrainBatch, metrics: dict[str, float]) -> None:
        if self.old_log_prob_source == "rollout":
            batch.old_log_probs = batch.rollout_log_probs
            return
        with timer("old_log_prob", metrics):
            batch.old_log_probs = self.actor.compute_log_probs(batch)
        mask = batch.response_mask
        diff = (batch.old_log_probs - batch.rollout_log_probs).abs()
        metrics["training/rollout_logprob_diff_mean"] = float(masked_mean(diff, mask))
        if self.old_log_prob_source == "proximal":
            level = self.actor.cfg.off_policy_correction
            batch.is_weights, m = truncated_is_weights(
                batch.old_log_probs, batch.rollout_log_probs, mask,
                level="token" if level == "none" else level, cap=self.actor.cfg.is_cap)
            metrics |= m

    def _advantages(self, batch: TrainBatch, groups: Sequence[Group], metrics: dict[str, float]) -> None:
        alg = self.algorithm
        batch.token_level_rewards = batch.token_level_scores
        if alg.use_kl_in_reward:
            assert batch.ref_log_probs is not None, "algorithm.use_kl_in_reward needs a reference model"
            assert batch.old_log_probs is not None, "old log-probs come first"
            batch.token_level_rewards, m = apply_kl_in_reward(
                batch.token_level_scores, batch.old_log_probs, batch.ref_log_probs,
                batch.response_mask, self.kl_ctrl.value, alg.kl_penalty)
            self.kl_ctrl.update(m["actor/reward_kl_penalty"], n_steps=batch.size)
            metrics |= m
        baselines = None
        if alg.adv_estimator == "remax":
            baselines = torch.tensor([g.baseline_reward or 0.0 for g in groups
                                      for _ in g.trajectories])
        batch.advantages, batch.returns = compute_advantage(
            alg.adv_estimator, batch.token_level_rewards, batch.response_mask, batch.index,
            values=batch.values, reward_baselines=baselines, gamma=alg.gamma, lam=alg.lam,
            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
        mask = batch.response_mask
        metrics |= masked_stats("critic/advantages", batch.advantages, mask)
        metrics |= masked_stats("critic/returns", batch.returns, mask)
        metrics |= masked_stats("critic/rewards", batch.token_level_rewards.sum(-1), torch.ones(batch.size))

