"""The run's derived numbers, computed once from the configuration: how many prompts make an
update, how many updates and optimizer steps the run takes, the staleness budget, where PPO's old
log-probs come from, the micro-batch token budgets (`scheduling.micro_budget`). `build_context`
computes the plan, logs it in one start line and saves it beside `config.yaml`; the pipelines,
the worker factory and the simulator read it instead of re-deriving from the config.

Pure: the one scheduling module that reads a `Config`, because the plan is the whole run's; no
I/O, no devices (the device is an argument: the simulator's profile has its own; a CUDA
trainer's memory and model shape are read by the caller and passed in as a `TrainerDevice`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncrl.scheduling.batching import num_mini_batches, prompts_per_update
from asyncrl.scheduling.micro_budget import (
    CPU_MICRO_BATCH_TOKENS,
    GiB,
    TrainerDevice,
    TrainerLoad,
    cuda_micro_batch_tokens,
    load_bytes_per_token,
    micro_batch_budgets,
    trainer_bytes,
)
from asyncrl.scheduling.old_log_probs import PASS_SOURCES, OldLogProbSource, old_log_prob_source
from asyncrl.scheduling.precision_path import PrecisionPath, describe, precision_path
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
    micro_batch_tokens: int
    """Tokens of one training micro-batch: `actor.ppo_micro_batch_tokens`, resolved (0 there: derived)."""
    log_prob_micro_batch_tokens: int
    """Tokens of one forward-only micro-batch: old and reference log-probs, critic values."""
    micro_batch_basis: str
    """Where the training budget came from: "set", "default" or how it was sized."""
    torch_compile: bool
    """Whether the trainer compiles its decoder layers: `actor.use_torch_compile`, null resolved by device."""
    precision: PrecisionPath
    """The trainer's mixed-precision path (`scheduling.precision_path`): `model.mixed_precision` resolved."""

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
                f"{self.optimizer_steps} optimizer steps{sync}{budget}, old log-probs: {self.old_log_probs}, "
                f"micro-batches of {self.micro_batch_tokens} tokens ({self.micro_batch_basis}), "
                f"{self.log_prob_micro_batch_tokens} forward-only, precision {describe(self.precision)}, "
                f"layers {'compiled' if self.torch_compile else 'eager'}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan_run(cfg: Config, device: str | None = None, trainer_device: TrainerDevice | None = None) -> RunPlan:
    """The plan of `cfg`, on `device` (default `trainer.device`; the simulator passes its
    profile's); `trainer_device`: a CUDA trainer's memory and model shape, which size the
    micro-batch budgets left at 0."""
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
    budgets = _micro_batch_budgets(cfg, device or cfg.trainer.device, trainer_device)
    return RunPlan(cfg.pipeline, per_update, total, updates, minis, optimizer_steps, per_sync, per_version, source,
                   *budgets, torch_compile=torch_compile(a.use_torch_compile, device or cfg.trainer.device),
                   precision=precision_path(cfg.model.mixed_precision, cfg.model.dtype))


def torch_compile(key: bool | None, device: str) -> bool:
    """`actor.use_torch_compile`: as set, else off on every device. On a CPU measured: the compile
    costs about 25 steps' saving, more than a CPU run or test takes (docs/training.md). On CUDA off
    until a GPU measurement says otherwise (docs/gpu.md): a 20-60 s cold compile in every fresh
    process, not yet run on torch 2.11 / transformers 5.17, against a gain not yet measured; the
    GPU session's trainer bench runs the `compiled` row beside the default one to decide it."""
    del device  # the same default everywhere until the GPU measurement; the argument stays for it
    return bool(key)


def _micro_batch_budgets(cfg: Config, device: str, trainer_device: TrainerDevice | None) -> tuple[int, int, str]:
    """(training, forward-only, basis): the keys where set, else sized for a CUDA trainer from
    its memory, else `CPU_MICRO_BATCH_TOKENS` (the CPU, the simulator, or CUDA when the device or
    the model's shape is unknown)."""
    a = cfg.actor
    derived, basis = CPU_MICRO_BATCH_TOKENS, "set" if a.ppo_micro_batch_tokens else "default"
    if not a.ppo_micro_batch_tokens and device == "cuda":
        if trainer_device is None:
            basis = "default: the device's memory or the model's shape unknown"
        else:
            share = cfg.rollout.gpu_memory_utilization if engine_shares_trainer_device(cfg) else 0.0
            load = trainer_load(cfg, device)
            derived = cuda_micro_batch_tokens(trainer_device, share, load)
            per_token = load_bytes_per_token(trainer_device.shape, load, derived)
            basis = (f"sized: {trainer_bytes(trainer_device.total_bytes, share) / GiB:.1f} GiB left to the "
                     f"trainer, {per_token / 2**20:.2f} MiB per token")
    return (*micro_batch_budgets(a.ppo_micro_batch_tokens, a.log_prob_micro_batch_tokens, derived), basis)


def engine_shares_trainer_device(cfg: Config) -> bool:
    """Whether a rollout engine takes its `rollout.gpu_memory_utilization` share of the trainer's
    GPU: colocated, and decoupled in one process (local) or beside it (processes: the trainer is
    capped at the rest); Ray places a decoupled run's sides on GPUs of their own."""
    return cfg.pipeline == "colocated" or cfg.backend != "ray"


def trainer_load(cfg: Config, device: str) -> TrainerLoad:
    """What the trainer holds besides activations, as the worker factory builds it on `device`:
    its precision path, and the head over vocabulary chunks where `choose_head` takes it on CUDA
    (all but a LoRA-wrapped `lm_head`; a model that soft-caps its logits, which the actor finds
    at start-up, takes the full logits, more than this counts: set actor.ppo_micro_batch_tokens)."""
    m = cfg.model
    return TrainerLoad(compute_bytes=2 if m.dtype == "bfloat16" else 4,
                       precision=precision_path(m.mixed_precision, m.dtype),
                       chunked_head=device == "cuda" and not (m.lora_rank and "lm_head" in m.target_modules),
                       checkpointing=m.enable_gradient_checkpointing, lora_rank=m.lora_rank,
                       reference=cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward,
                       critic=cfg.algorithm.adv_estimator == "gae", ranks=cfg.trainer.ranks)
