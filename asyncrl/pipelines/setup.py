"""Build everything a run needs from the config: model, data, engines, workers, sinks.

`build_context(cfg)` is the only place that reads the whole config; each worker receives its
own section. The returned `RunContext` is what a pipeline loop drives.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.config import config_to_dict, dump_config
from asyncrl.config_schema import Config
from asyncrl.data import PromptIterator, load_rows, make_task, tokenize_rows
from asyncrl.errors import ConfigError
from asyncrl.models import load_model
from asyncrl.rollout import TorchEngine
from asyncrl.telemetry.loggers import Tracker, make_tracker
from asyncrl.telemetry.trace import Trace
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.critic import Critic
from asyncrl.training.optim import seed_everything
from asyncrl.types import PromptRow
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RolloutWorker
from asyncrl.workers.trainer import PPOTrainer


@dataclass
class RunContext:
    cfg: Config
    output_dir: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    train_rows: list[PromptRow]
    val_rows: list[PromptRow]
    prompts: PromptIterator
    rollout: RolloutWorker
    reward: RewardWorker
    trainer: PPOTrainer
    trace: Trace
    log: Callable[[str], None] = print
    tracker: Tracker | None = None
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def actor(self) -> Actor:
        return self.trainer.actor


def set_threads(n: int) -> None:
    torch.set_num_threads(n or os.cpu_count() or 1)


def build_context(cfg: Config, *, old_log_prob_source: str = "recompute",
                  log: Callable[[str], None] = print) -> RunContext:
    seed_everything(cfg.seed)
    set_threads(cfg.num_threads)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.yaml")
    model, tok = load_model(cfg.model, log)
    train_rows, val_rows = _load_data(cfg, tok, log)
    reward = RewardWorker(tok, cfg.reward)
    reward.check(train_rows + val_rows)
    rollout = RolloutWorker(_engines(cfg, model, tok), cfg.rollout,
                            max_tokens=cfg.data.max_response_length, seed=cfg.seed)
    trainer = _trainer(cfg, model, tok, old_log_prob_source)
    prompts = PromptIterator(train_rows, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed)
    return RunContext(cfg=cfg, output_dir=out, model=model, tokenizer=tok, train_rows=train_rows,
                      val_rows=val_rows, prompts=prompts, rollout=rollout, reward=reward,
                      trainer=trainer, trace=Trace(), log=log)


def open_tracker(ctx: RunContext, initial_step: int) -> Tracker:
    t = ctx.cfg.trainer
    return make_tracker(t.logger, ctx.output_dir, total_steps=t.total_training_steps,
                        initial_step=initial_step, project=t.project_name,
                        experiment=t.experiment_name, config=config_to_dict(ctx.cfg))


def _load_data(cfg: Config, tok: PreTrainedTokenizerBase,
               log: Callable[[str], None]) -> tuple[list[PromptRow], list[PromptRow]]:
    d = cfg.data
    if d.train_files:
        train = [r for i, f in enumerate(d.train_files) for r in load_rows(f, split_name=f"train{i}")]
    else:
        train = make_task(d.task, d.task_size, seed=cfg.seed, split="train")
    if d.val_files:
        val = [r for i, f in enumerate(d.val_files) for r in load_rows(f, split_name=f"val{i}")]
    elif d.train_files:
        val = []
    else:
        val = make_task(d.task, d.val_size, seed=cfg.seed, split="test")
    template = d.chat_template or None
    train, n_train_filtered = tokenize_rows(train, tok, d.max_prompt_length, chat_template=template)
    val, n_val_filtered = tokenize_rows(val, tok, d.max_prompt_length, chat_template=template)
    if n_train_filtered or n_val_filtered:
        log(f"filtered prompts longer than data.max_prompt_length={d.max_prompt_length}: "
            f"{n_train_filtered} train, {n_val_filtered} val")
    if len(train) < d.train_batch_size:
        raise ConfigError(f"only {len(train)} training prompts remain after filtering, fewer than "
                          f"data.train_batch_size={d.train_batch_size}")
    return train, val


def _engines(cfg: Config, model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> list[TorchEngine]:
    r = cfg.rollout
    return [TorchEngine(copy.deepcopy(model).eval(), eos_token_id=eos_ids(model, tok),
                        kv_budget_tokens=r.kv_budget_tokens, max_num_seqs=r.max_num_seqs,
                        device=cfg.trainer.device, seed=cfg.seed + i)
            for i in range(r.num_engines)]


def eos_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS plus any the model's generation config lists (chat models have two)."""
    extra = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    extra = extra if isinstance(extra, list) else [extra] if extra is not None else []
    return sorted({tok.eos_token_id, *extra})


def _trainer(cfg: Config, model: PreTrainedModel, tok: PreTrainedTokenizerBase,
             old_log_prob_source: str) -> PPOTrainer:
    ref = None
    if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        ref = RefWorker(copy.deepcopy(model), cfg.rollout.temperature or 1.0, cfg.actor.ppo_micro_batch_tokens)
    critic = None
    if cfg.algorithm.adv_estimator == "gae":
        critic = Critic(model, cfg.critic, micro_batch_tokens=cfg.actor.ppo_micro_batch_tokens,
                        loss_agg_mode=cfg.actor.loss_agg_mode)
    actor = Actor(model, cfg.actor, temperature=cfg.rollout.temperature or 1.0,
                  norm_length=cfg.data.max_response_length)
    return PPOTrainer(actor, cfg.algorithm, pad_id=tok.pad_token_id, ref=ref, critic=critic,
                      old_log_prob_source=old_log_prob_source)
