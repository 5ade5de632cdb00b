"""Factories that build each side of a run from the config, wherever it runs: in this
process (local substrate) or inside a Ray actor (the actor builds its own model).

Each receives the whole config but hands every worker only its own section. Their return
types are the roles (`asyncrl.roles`), so `mypy` checks the real workers against them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import cast

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.agents.build import episode_from_config, message_template_kwargs, prompt_data
from asyncrl.agents.episode import Episode
from asyncrl.config.schema import Config
from asyncrl.data import load_rows
from asyncrl.data.held_out import prompt_rows, val_rows
from asyncrl.data.tasks import task_rows
from asyncrl.errors import ConfigError
from asyncrl.models import load_model
from asyncrl.roles import RolloutSide, TrainerSide
from asyncrl.rollout.registry import build_engine
from asyncrl.scheduling.plan import RunPlan
from asyncrl.training.actor import Actor, RefWorker
from asyncrl.training.compile import compile_layers
from asyncrl.training.critic import Critic
from asyncrl.training.memory import enable_gradient_checkpointing
from asyncrl.training.model import prepare_actor_model
from asyncrl.training.packed_attention import use_packed_attention
from asyncrl.training.reward_model import RewardModel
from asyncrl.types import PromptRow
from asyncrl.workers.handles import share_worker_thread
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder
from asyncrl.workers.rollout_server import RolloutServer
from asyncrl.workers.trainer import PPOTrainer


def load_data(cfg: Config, tok: PreTrainedTokenizerBase,
               log: Callable[[str], None]) -> tuple[list[PromptRow], list[PromptRow]]:
    # the tool episode's prompts list its tools
    d = prompt_data(cfg.data, cfg.rollout.multi_turn, cfg.sandbox, cfg.rollout.agent.entrypoint)

    def prompts(rows: list[PromptRow], source: str) -> list[PromptRow]:
        return prompt_rows(rows, d, tok, source, log)

    if d.train_files:
        train = [r for i, f in enumerate(d.train_files) for r in prompts(load_rows(f, split_name=f"train{i}"), f)]
    else:
        train = prompts(task_rows(d, d.task_size, seed=cfg.seed, split="train"), f"data.task={d.task}")
    # a run on its own files validates only on files it names, never on the built-in task
    val = val_rows(d, cfg.seed, tok, log)[0] if d.val_files or not d.train_files else []
    if len(train) < d.train_batch_size:
        raise ConfigError(f"only {len(train)} training prompts remain after filtering, fewer than "
                          f"data.train_batch_size={d.train_batch_size}")
    return train, val


def build_rollout_server(cfg: Config, index: int = 0, model: PreTrainedModel | None = None,
                         tok: PreTrainedTokenizerBase | None = None, compute: Executor | None = None) -> RolloutSide:
    """Rollout worker `index`: its engine (`rollout.engine`, own copy of the weights, stepping on
    `compute` if given, `asyncrl.compute`) and rewards (with `reward.model_path`, its own copy of
    the reward model, on the engine's device and compute thread)."""
    if model is None or tok is None:
        model, tok = load_model(cfg.model, lambda _: None)
    copy_for_engine = cast(nn.Module, copy.deepcopy(model)).to(device=cfg.trainer.device, dtype=compute_dtype(cfg))
    engine = build_engine(cfg.rollout, copy_for_engine.eval(), eos_ids(model, tok),
                          device=cfg.trainer.device, seed=cfg.seed + index, compute=compute,
                          max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length)
    requests = RequestBuilder(cfg.rollout, max_tokens=cfg.data.max_response_length, seed=cfg.seed)
    reward_model = RewardModel.load(cfg.reward, tok, cfg.trainer.device, compute_dtype(cfg), compute) \
        if cfg.reward.model_path else None  # beside this host's engine, on its compute thread
    reward = RewardWorker(tok, cfg.reward, window=cfg.data.train_batch_size * cfg.rollout.n, sandbox=cfg.sandbox,
                          scheduler=cfg.reward_scheduler, max_response_length=cfg.data.max_response_length,
                          reward_model=reward_model)
    episode = agent_episode(cfg) if cfg.rollout.agent.entrypoint else episode_from_config(
        cfg.rollout.multi_turn, tok, sandbox=cfg.sandbox, template_kwargs=message_template_kwargs(cfg.data))
    return RolloutServer(engine, requests, reward, score_each=cfg.reward_scheduler.enable, episode=episode)


def agent_episode(cfg: Config) -> Episode:
    """The episode of `rollout.agent.entrypoint` (imported here: starlette and openai load only for it)."""
    from asyncrl.agents.gateway import AgentEpisode

    return AgentEpisode(cfg.rollout.agent, cfg.rollout.multi_turn, max_prompt_tokens=cfg.data.max_prompt_length,
                        template_kwargs=message_template_kwargs(cfg.data),
                        max_failure_ratio=cfg.reward.max_failure_ratio,
                        window=cfg.data.train_batch_size * cfg.rollout.n)


def eos_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS plus any the model's generation config lists (chat models have two)."""
    extra = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    extra = extra if isinstance(extra, list) else [extra] if extra is not None else []
    return sorted({tok.eos_token_id, *extra})


def build_trainer_side(cfg: Config, plan: RunPlan, model: PreTrainedModel | None = None,
                       tok: PreTrainedTokenizerBase | None = None,
                       compute: ThreadPoolExecutor | None = None) -> TrainerSide:
    """Actor (+ reference, + critic for gae) around `model`, loaded here when not given; it
    trains on `compute` if given (a compute thread, `asyncrl.compute`), else on its own thread."""
    if model is None or tok is None:
        model, tok = load_model(cfg.model, lambda _: None)
    cast(nn.Module, model).to(cfg.trainer.device)  # in place, float32: each worker applies its precision path
    dtype, pack, mixed = compute_dtype(cfg), cfg.model.use_remove_padding, cfg.model.mixed_precision
    if pack:  # before the copies below: reference, critic and actor keep the chosen kernel
        use_packed_attention(model, cfg.model.packed_attention)
    ref = None
    if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        ref = RefWorker(compile_layers(copy.deepcopy(model), plan.torch_compile), cfg.rollout.temperature or 1.0,
                        plan.log_prob_micro_batch_tokens, compute_dtype=dtype, use_remove_padding=pack,
                        mixed_precision=mixed)
    critic = None
    if cfg.algorithm.adv_estimator == "gae":
        critic = Critic(model, cfg.critic, micro_batch_tokens=plan.micro_batch_tokens,
                        forward_micro_batch_tokens=plan.log_prob_micro_batch_tokens,
                        loss_agg_mode=cfg.actor.loss_agg_mode, compute_dtype=dtype, use_remove_padding=pack,
                        mixed_precision=mixed)
        if cfg.model.enable_gradient_checkpointing:
            enable_gradient_checkpointing(critic.model.body)
    # Reference and critic copied the base model above; the actor trains it (LoRA: its adapters).
    budgets = dataclasses.replace(cfg.actor, ppo_micro_batch_tokens=plan.micro_batch_tokens,
                                  log_prob_micro_batch_tokens=plan.log_prob_micro_batch_tokens)
    actor = Actor(compile_layers(prepare_actor_model(model, cfg.model), plan.torch_compile), budgets,
                  temperature=cfg.rollout.temperature or 1.0, norm_length=cfg.data.max_response_length,
                  total_steps=plan.optimizer_steps, compute_dtype=dtype, use_remove_padding=pack, mixed_precision=mixed)
    assert actor.precision.path == plan.precision, (actor.precision.path, plan.precision)  # as the start line says
    trainer = PPOTrainer(actor, cfg.algorithm, pad_id=tok.pad_token_id, ref=ref, critic=critic,
                         old_log_prob_source=plan.old_log_probs)
    if compute is not None:
        share_worker_thread(trainer, compute)
    return trainer


def compute_dtype(cfg: Config) -> torch.dtype:
    """`model.dtype`: what forwards compute in (the trainer's bf16 parameters or autocast,
    `model.mixed_precision`; the engines' weights); the trainer's master weights and optimizer
    state stay float32."""
    return getattr(torch, cfg.model.dtype)
