"""The PPO/GRPO training step on finished groups, shared by every pipeline.

Pipelines differ in how groups are produced (colocated, one-step-off, streamed); what happens
to a batch of groups does not: old log-probs → reference log-probs → values → KL-in-reward →
advantages → critic update → actor update, each a named timed stage.

Old log-probs come from one of four sources (`asyncrl.scheduling.old_log_probs`, decided once by the run plan):
- "recompute": a pass of the actor's current weights before the update (verl's; on-policy);
- "update": none before the update; the actor takes its own forward's log-probs, detached (exact
  when the batch is one optimizer step on the weights that generated it);
- "rollout": the engine's behaviour log-probs (`async_training.use_rollout_log_probs`, or
  colocated where the engine computes them as the trainer does);
- "proximal": recomputed proximal policy plus truncated importance weights behaviour →
  proximal (AReaL's decoupled PPO; `actor.off_policy_correction`).

The stream trainer splits the same step over chunks of groups: `accumulate_groups(chunk)` runs
every stage up to the actor's backward on the groups that finished (old log-probs under the
current, not yet updated weights; advantages per group, which is all a group estimator needs),
and `apply_update()` makes the one optimizer step once the batch is in. Stage timings add up over
the chunks, batch statistics are taken over all of them and the adaptive KL-in-reward controller
moves once per batch, so its metrics have the keys and values of `train_groups` on the same batch.
Not for a critic or a proximal policy (`asyncrl.config` rules those out).

A CUDA out-of-memory error in the forward-only passes or in an update leaves the trainer as
`asyncrl.errors.OutOfMemory`, one line naming the micro-batch budgets (the pass's own first),
`rollout.gpu_memory_utilization` and gradient checkpointing (`asyncrl.oom`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from asyncrl.algorithms.advantages import episode_advantage
from asyncrl.algorithms.agg import masked_mean
from asyncrl.algorithms.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward
from asyncrl.algorithms.off_policy import truncated_is_weights
from asyncrl.config.schema import AlgorithmConfig
from asyncrl.oom import out_of_memory_as
from asyncrl.scheduling.batching import num_mini_batches
from asyncrl.scheduling.old_log_probs import PASS_SOURCES, OldLogProbSource
from asyncrl.sync import TrainerWeights
from asyncrl.telemetry.metrics import masked_stats, timer
from asyncrl.telemetry.perf import ModelShape, actor_mfu, cuda_name, memory_metrics
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.batch import TrainBatch, build_batch, episode_rows
from asyncrl.training.compile import compile_metrics
from asyncrl.training.critic import Critic
from asyncrl.types import Group, WeightMeta
from asyncrl.workers.handles import blocking


@dataclass
class _Stream:
    """What `accumulate_groups` has taken since the last `apply_update`."""

    timings: dict[str, float] = field(default_factory=dict)  # timing_s/* summed over chunks
    batches: list[TrainBatch] = field(default_factory=list)  # for the batch statistics
    kl_sum: float = 0.0  # sum over rows of each sequence's mean KL to the reference (KL-in-reward)


class PPOTrainer:
    """`asyncrl.roles.TrainerSide` over an actor (+ reference, + critic). Its blocking methods
    run on its own worker thread (`num_threads` torch threads; 0 = the caller's count)."""

    def __init__(self, actor: Actor, algorithm: AlgorithmConfig, *, pad_id: int,
                 ref: RefWorker | None = None, critic: Critic | None = None,
                 old_log_prob_source: OldLogProbSource = "recompute", num_threads: int = 0) -> None:
        self.num_threads = num_threads
        self.actor, self.ref, self.critic = actor, ref, critic
        self.algorithm = algorithm
        self.pad_id = pad_id
        self.old_log_prob_source = old_log_prob_source
        self.weights = TrainerWeights(actor.model, export=actor.named_weights)
        kl = algorithm.kl_ctrl
        self.kl_ctrl = (AdaptiveKLController(kl.kl_coef, kl.target_kl, kl.horizon)
                        if kl.type == "adaptive" else FixedKLController(kl.kl_coef))
        self._stream: _Stream | None = None

    def train(self, groups: Sequence[Group], metrics: dict[str, float]) -> dict[str, float]:
        """One update on these groups; stage timings and results go into `metrics`."""
        assert self._stream is None, "train_groups between accumulate_groups and apply_update"
        minis = num_mini_batches(len(groups), self.actor.cfg.ppo_mini_batch_size)
        batch = self._prepare(groups, metrics)
        metrics |= self._batch_metrics([batch])
        if self.algorithm.use_kl_in_reward:
            self.kl_ctrl.update(metrics["actor/reward_kl_penalty"], n_steps=batch.size)
        if self.critic is not None:
            with timer("update_critic", metrics), self._out_of_memory(forward_only=False):
                metrics |= self.critic.train_step(batch, minis)
        with timer("update_actor", metrics), self._out_of_memory(forward_only=False):
            metrics |= self.actor.train_step(batch, minis)
        return metrics | self._perf([batch], metrics, passes=self.actor.cfg.ppo_epochs)

    @blocking
    def train_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """`train` on the worker thread: returns its own metrics."""
        return self.train(groups, {})

    @blocking
    def accumulate_groups(self, groups: Sequence[Group]) -> dict[str, float]:
        """The gradients of these finished groups, added for the next `apply_update` (weights do
        not change); returns this chunk's stage timings and statistics."""
        assert self.critic is None and self.old_log_prob_source != "proximal", \
            "the stream trainer needs a critic-free estimator and on-policy old log-probs"
        stream = self._stream = self._stream or _Stream()
        metrics: dict[str, float] = {}
        batch = self._prepare(groups, metrics)
        with timer("update_actor", metrics), self._out_of_memory(forward_only=False):
            self.actor.accumulate(batch)
        for k, v in metrics.items():
            if k.startswith("timing_s/"):
                stream.timings[k] = stream.timings.get(k, 0.0) + v
        stream.batches.append(batch)
        stream.kl_sum += metrics.get("actor/reward_kl_penalty", 0.0) * batch.size
        return metrics | self._batch_metrics([batch])

    @blocking
    def apply_update(self) -> dict[str, float]:
        """One optimizer step on everything `accumulate_groups` took since the last one; the
        metrics (keys and values) of `train_groups` on those groups as one batch."""
        assert self._stream is not None, "apply_update without accumulate_groups: nothing to apply"
        stream, self._stream = self._stream, None
        metrics = dict(stream.timings) | self._batch_metrics(stream.batches)
        if self.algorithm.use_kl_in_reward:
            current_kl = stream.kl_sum / sum(b.size for b in stream.batches)
            metrics |= {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value}
            self.kl_ctrl.update(current_kl, n_steps=sum(b.size for b in stream.batches))
        with timer("update_actor", metrics), self._out_of_memory(forward_only=False):
            metrics |= self.actor.apply_update()
        return metrics | self._perf(stream.batches, metrics, passes=1)

    def _perf(self, batches: Sequence[TrainBatch], metrics: dict[str, float], passes: int) -> dict[str, float]:
        """This process's memory, on a known GPU the actor update's MFU (`telemetry.perf`), and with
        compiled layers what compiling took since the last step (`training.compile`)."""
        device = next(self.actor.model.parameters()).device
        lens = [int(n) for b in batches for n in b.attention_mask.sum(-1)]
        shape = ModelShape.from_hf(getattr(self.actor.model, "config", None))
        return memory_metrics(device) | actor_mfu(shape, lens, metrics.get("timing_s/update_actor", 0.0),
                                                  passes, cuda_name(device)) | compile_metrics(self.actor.model)

    def _prepare(self, groups: Sequence[Group], metrics: dict[str, float]) -> TrainBatch:
        """The batch of these groups with old/ref log-probs, values and advantages."""
        batch = build_batch(groups, self.pad_id)
        with self._out_of_memory(forward_only=True):
            self._old_log_probs(batch, metrics)
            if self.ref is not None:
                with timer("ref", metrics):
                    batch.ref_log_probs = self.ref.compute_log_probs(batch)
            if self.critic is not None:
                with timer("values", metrics):
                    batch.values = self.critic.compute_values(batch)
        with timer("adv", metrics):
            self._advantages(batch, groups, metrics)
        return batch

    def _out_of_memory(self, forward_only: bool) -> AbstractContextManager[None]:
        """CUDA running out in these passes as `OutOfMemory`, naming their own budget first."""
        a = self.actor.cfg
        train = f"actor.ppo_micro_batch_tokens (now {a.ppo_micro_batch_tokens})"
        forward = f"actor.log_prob_micro_batch_tokens (now {a.log_prob_micro_batch_tokens})"
        if forward_only:
            return out_of_memory_as("the forward-only passes (old log-probs, reference, values)",
                                    (forward, train, "rollout.gpu_memory_utilization"))
        return out_of_memory_as("the update", (train, forward, "rollout.gpu_memory_utilization"))

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
        if self.old_log_prob_source == "update":
            return  # the actor's own forward gives them (Actor._micro_batch_loss)
        with timer("old_log_prob", metrics):
            batch.old_log_probs = self.actor.compute_log_probs(batch)
        mask = batch.loss_mask  # a tool token has no behaviour log-prob: it never enters a weight
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
                batch.loss_mask, self.kl_ctrl.value, alg.kl_penalty)
            metrics |= m  # the controller moves once per batch, after its last chunk
        baselines = None
        if alg.adv_estimator == "remax":
            baselines = torch.tensor([g.baseline_reward or 0.0 for g in groups
                                      for t in g.trajectories for _ in (*t.chains, t)])
        batch.advantages, batch.returns = episode_advantage(
            alg.adv_estimator, batch.token_level_rewards, batch.loss_mask, batch.index, episode_rows(groups),
            values=batch.values, reward_baselines=baselines, gamma=alg.gamma, lam=alg.lam,
            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)

    def _batch_metrics(self, batches: Sequence[TrainBatch]) -> dict[str, float]:
        """Statistics over the trained response tokens (rows for rewards) of all these prepared
        batches, the rows trained (`training/sequences`); with multi-turn episodes among them,
        their model tokens per response too."""
        def tokens(b: TrainBatch, values: torch.Tensor | None) -> torch.Tensor:
            assert values is not None, "prepare the batch first"
            return values[b.loss_mask.bool()]

        def cat(values: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat(values).float()

        adv = cat([tokens(b, b.advantages) for b in batches])
        ret = cat([tokens(b, b.returns) for b in batches])
        rewards = cat([b.token_level_rewards.sum(-1) for b in batches if b.token_level_rewards is not None])
        metrics = masked_stats("critic/advantages", adv, torch.ones_like(adv))
        metrics["training/sequences"] = float(sum(b.size for b in batches))  # an agent episode's chains: one each
        metrics |= masked_stats("critic/returns", ret, torch.ones_like(ret))
        metrics |= masked_stats("critic/rewards", rewards, torch.ones_like(rewards))
        if self.old_log_prob_source in PASS_SOURCES:
            diff = cat([tokens(b, b.old_log_probs) - tokens(b, b.rollout_log_probs) for b in batches]).abs()
            metrics["training/rollout_logprob_diff_mean"] = float(masked_mean(diff, torch.ones_like(diff)))
        if any(b.has_context_tokens for b in batches):
            model = cat([b.loss_mask.sum(-1) for b in batches])
            metrics |= masked_stats("response_length/model_tokens", model, torch.ones_like(model))
            metrics["response_length/model_token_ratio"] = float(model.sum() / cat(
                [b.response_mask.sum(-1) for b in batches]).sum().clamp_min(1.0))
        return metrics

