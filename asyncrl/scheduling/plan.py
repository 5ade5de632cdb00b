"""The run's derived numbers, computed once from the configuration: how many prompts make an
update, how many updates and optimizer steps the run takes, the staleness budget, where PPO's old
log-probs come from. `build_context` computes the plan, logs it in one start line and saves it
beside `config.yaml`; the pipelines, the worker factory and the simulator read it instead of
re-deriving from the config.

Pure: the one scheduling module that reads a `Config`, because the plan is the whole run's; no
I/O, no devices (the device is an argument: the simulator's profile has its own).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncrl.scheduling.batching import num_mini_batches, prompts_per_update
from asyncrl.scheduling.old_log_probs import PASS_SOURCES, OldLogProbSource, old_log_prob_source
from asyncrl.scheduling.staleness import StalenessBudget

if TYPE_CHECKING:
    from asyncrl.config.schema import Config


@dataclass(frozen=True)
class RunPlan:
    """What a run will do, in numbers. Example (the defaults: colocated, 60 steps of 32 prompts,
    mini-batches of 16, one epoch): 1,920 prompts, 60 updates of 32 prompts, 2 mini-batches each,
    120 optimizer steps."""

    pipeline: str
    prompts_per_update: int
    """Prompts whose groups one update trains (fully async: require_batches x ppo_mini_batch_size)."""
    total_prompts: int
    """Prompts generated and trained over the run."""
    updates: int
    """Policy updates (weight versions) over the run: the progress bar's and the LR schedule's steps."""
    mini_batches: int
    """Optimizer steps of one update per PPO epoch."""
    optimizer_steps: int
    """The actor's optimizer steps over the run (what the LR schedule spans)."""
    updates_per_sync: int
    """Local updates between weight syncs (1 but in fully async)."""
    prompts_per_version: int
    """Staleness budget: prompts the rollout may start per weight version (fully async), else prompts per update."""
    old_log_probs: OldLogProbSource
    """Where PPO's old log-probs come from (`scheduling.old_log_probs`)."""

    @property
    def old_log_prob_pass(self) -> bool:
        """Whether the trainer runs a forward pass for old log-probs before each update."""
        return self.old_log_probs in PASS_SOURCES

    def line(self) -> str:
        """The start line: `plan: colocated, 1920 prompts = 60 updates x 32, ...`."""
        sync = f", sync every {self.updates_per_sync} updates" if self.updates_per_sync > 1 else ""
        budget = (f", at most {self.prompts_per_version} prompts started per version"
                  if self.pipeline == "fully_async" else "")
        return (f"plan: {self.pipeline}, {self.total_prompts} prompts = {self.updates} updates x "
                f"{self.prompts_per_update}, {self.mini_batches} mini-batch(es) per update, "
                f"{self.optimizer_steps} optimizer steps{sync}{budget}, old log-probs: {self.old_log_probs}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan_run(cfg: Config, device: str | None = None) -> RunPlan:
    """The plan of `cfg`, on `device` (default `trainer.device`; the simulator passes its profile's)."""
    a = cfg.actor
    fully_async = cfg.pipeline == "fully_async"
    steps, batch = cfg.trainer.total_training_steps, cfg.data.train_batch_size
    if fully_async:
        per_update = prompts_per_update(cfg.async_training.require_batches, a.ppo_mini_batch_size)
        total = cfg.rollout.total_rollout_steps or batch * steps
        updates, per_sync = math.ceil(total / per_update), cfg.async_training.trigger_parameter_sync_step
        per_version = StalenessBudget(per_update, per_sync, cfg.async_training.staleness_threshold).per_version
    else:
        per_update, total, updates, per_sync, per_version = batch, batch * steps, steps, 1, batch
    minis = num_mini_batches(per_update, a.ppo_mini_batch_size)
    optimizer_steps = updates if cfg.stream_trainer.enable else updates * minis * a.ppo_epochs
    exact = cfg.model.dtype == "float32" and (device or cfg.trainer.device) == "cpu"
    source = old_log_prob_source(
        a.old_log_probs, colocated=cfg.pipeline == "colocated",
        one_step=a.ppo_epochs == 1 and a.ppo_mini_batch_size >= batch, kl_in_reward=cfg.algorithm.use_kl_in_reward,
        exact_rollout=exact, use_rollout_log_probs=cfg.async_training.use_rollout_log_probs,
        off_policy_correction=a.off_policy_correction)
    return RunPlan(cfg.pipeline, per_update, total, updates, minis, optimizer_steps, per_sync, per_version, source)
