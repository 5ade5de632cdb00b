"""verl's config keys, read as asyncrl's: the one declared table from verl's names to ours.

A verl recipe's command line (`actor_rollout_ref.actor.optim.lr=1e-6 data.train_batch_size=512
+reward_model.reward_kwargs.x=1 ...`) works in `asyncrl train` and `asyncrl sim` as it is:
`TABLE` maps each verl key asyncrl models to our key(s), converting where units or sentinels
differ (`trainer.test_freq=-1` -> 0, `ppo_max_token_len_per_gpu` -> `actor.ppo_micro_batch_tokens`,
`log_prob_max_token_len_per_gpu` -> `actor.log_prob_micro_batch_tokens`);
`NOT_MODELLED` lists the verl keys (and subtrees) we knowingly do not model. Those are named in
one warning (logger `asyncrl.config`), never silently dropped; a key in neither list and not
ours is the usual unknown-key error. `translate` does the mapping; `config.load_config` calls it.

It does not run verl or read verl's YAML defaults: keys a command line leaves unset take
asyncrl's defaults, except the few in `VERL_DEFAULTS` whose verl default changes what a run
trains (learning rate, warm-up, weight decay, greedy validation). docs/migrating.md explains
each difference. Keys are as of verl b178a3cd (2026-01, `verl/trainer/config/ppo_trainer.yaml`
and the one-step-off / fully-async recipe configs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.keys import leaf_keys, section_keys, unknown_key_message
from asyncrl.errors import ConfigError

log = logging.getLogger("asyncrl.config")


class NotModelled(Exception):
    """A verl value asyncrl has no equivalent of (the key then goes into the warning)."""


def _same(value: Any) -> Any:
    return value


def _off_is_zero(value: Any) -> Any:
    """verl's -1 / null (off, never) is our 0."""
    return 0 if value is None or (isinstance(value, int) and value < 0) else value


def _not_null(value: Any) -> Any:
    if value is None:
        raise NotModelled
    return value


@dataclass(frozen=True)
class To:
    """Where one verl key goes: our keys (`@name`: held for `_derive`; none: a value asyncrl
    always has, checked by `convert`), and the conversion of its value."""

    ours: tuple[str, ...]
    convert: Callable[[Any], Any] = _same
    weak: bool = False
    """Set only where no other key of the command line sets it (verl's clip_ratio under clip_ratio_low)."""


def to(*ours: str, convert: Callable[[Any], Any] = _same, weak: bool = False) -> To:
    return To(ours, convert, weak)


def always(*values: Any) -> To:
    """A verl setting asyncrl always has with one of `values`; any other value is not modelled."""
    def check(value: Any) -> Any:
        if value not in values:
            raise NotModelled
        return value
    return To((), check)


A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
FLOAT32 = ("fp32", "float32")
BF16 = ("bf16", "bfloat16")
"""verl's names of the two dtypes (`PrecisionType.to_dtype`)."""
_SAME = ("data.train_files", "data.val_files", "data.max_prompt_length", "data.max_response_length",
         "data.shuffle", "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma",
         "algorithm.lam", "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type",
         "algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl",
         "algorithm.filter_groups.enable", "algorithm.filter_groups.max_num_gen_batches", "critic.cliprange_value",
         "critic.ppo_epochs", "critic.grad_clip", "trainer.logger", "trainer.project_name", "trainer.experiment_name",
         "trainer.val_before_train", "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.device",
         "rollout.nnodes", "rollout.n_gpus_per_node", "rollout.total_rollout_steps", "rollout.test_freq",
         "async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
         "async_training.require_batches", "async_training.partial_rollout", "async_training.use_rollout_log_probs")

TABLE: dict[str, To] = {
    **{key: to(key) for key in _SAME},
    "data.train_batch_size": to("data.train_batch_size"),  # 0 in fully-async recipes: see _derive
    "data.seed": to("seed", convert=_not_null),
    "data.filter_overlong_prompts": always(True),  # asyncrl drops (and counts) overlong prompts
    "data.truncation": always("error"),  # with filtering nothing is ever truncated
    "data.prompt_key": always("prompt"),
    "data.reward_fn_key": always("data_source"),
    "data.return_raw_chat": always(True, False),  # how verl hands prompts to its server: no effect here
    "data.gen_batch_size": always(1),  # fully async: one prompt at a time, as asyncrl streams
    "data.train_max_samples": always(-1),
    "data.val_max_samples": always(-1),
    A + "optim.lr": to("actor.lr"),
    A + "optim.lr_warmup_steps": to("actor.warmup_steps"),  # -1: use the ratio, in both
    A + "optim.lr_warmup_steps_ratio": to("actor.warmup_ratio"),
    A + "optim.lr_scheduler_type": to("actor.lr_scheduler"),
    A + "optim.warmup_style": to("actor.lr_scheduler", convert=_not_null),  # verl's older name
    A + "optim.min_lr_ratio": to("actor.min_lr_ratio"),
    A + "optim.num_cycles": always(0.5),  # half a cosine period, as ours
    A + "optim.weight_decay": to("actor.weight_decay"),
    A + "optim.betas": to("actor.betas"),
    A + "optim.clip_grad": to("actor.grad_clip"),
    A + "optim.optimizer": always("AdamW"),
    A + "optim.total_training_steps": always(-1),  # verl fills it in itself
    A + "grad_clip": to("actor.grad_clip"),
    A + "ppo_mini_batch_size": to("actor.ppo_mini_batch_size"),  # prompts, in both
    A + "ppo_epochs": to("actor.ppo_epochs"),
    A + "ppo_micro_batch_size_per_gpu": to("@micro_batch_sequences"),
    A + "ppo_max_token_len_per_gpu": to("@max_token_len"),
    A + "use_dynamic_bsz": to("@dynamic_bsz"),
    A + "clip_ratio": to("actor.clip_ratio_low", "actor.clip_ratio_high", weak=True),
    A + "clip_ratio_low": to("actor.clip_ratio_low"),
    A + "clip_ratio_high": to("actor.clip_ratio_high"),
    A + "clip_ratio_c": to("actor.clip_ratio_c"),
    A + "policy_loss.loss_mode": to("actor.policy_loss"),
    A + "entropy_coeff": to("actor.entropy_coeff"),
    A + "loss_agg_mode": to("actor.loss_agg_mode"),
    A + "use_kl_loss": to("actor.use_kl_loss"),
    A + "kl_loss_coef": to("actor.kl_loss_coef"),
    A + "kl_loss_type": to("actor.kl_loss_type"),
    A + "use_rollout_log_probs": to("async_training.use_rollout_log_probs"),
    A + "strategy": always("fsdp", "fsdp2"),  # the GPU trainer is FSDP2
    # FSDP mixed precision: bf16 parameters over float32 masters is our model.mixed_precision=param_dtype
    A + "fsdp_config.dtype": to("@param_dtype." + A + "fsdp_config.dtype"),
    A + "fsdp_config.mixed_precision.param_dtype": to("@param_dtype." + A + "fsdp_config.mixed_precision.param_dtype"),
    A + "fsdp_config.mixed_precision.reduce_dtype": always(*FLOAT32),  # gradients reduce in float32
    A + "fsdp_config.mixed_precision.buffer_dtype": always(*FLOAT32),  # buffers stay float32
    A + "fsdp_config.model_dtype": always(*FLOAT32),  # float32 master weights
    A + "ulysses_sequence_parallel_size": always(1),
    M + "path": to("model.path"),
    M + "lora_rank": to("model.lora_rank"),
    M + "lora_alpha": to("model.lora_alpha"),
    M + "target_modules": to("model.target_modules"),
    M + "enable_gradient_checkpointing": to("model.enable_gradient_checkpointing"),
    M + "use_remove_padding": to("model.use_remove_padding"),
    M + "custom_chat_template": to("data.chat_template", convert=_not_null),
    R + "n": to("rollout.n"),
    R + "temperature": to("rollout.temperature"),
    R + "top_p": to("rollout.top_p"),
    R + "top_k": to("rollout.top_k"),
    R + "tensor_model_parallel_size": to("rollout.tensor_model_parallel_size"),
    R + "max_num_seqs": to("rollout.max_num_seqs"),
    R + "gpu_memory_utilization": to("rollout.gpu_memory_utilization"),
    R + "ignore_eos": to("rollout.ignore_eos"),
    R + "val_kwargs.temperature": to("rollout.val_temperature"),
    R + "val_kwargs.n": to("rollout.val_n"),
    R + "val_kwargs.do_sample": to("@val_do_sample"),
    R + "do_sample": always(True),
    R + "mode": always("async"),  # asyncrl's engines are servers taking requests as they come
    R + "calculate_log_probs": always(True),  # the engine always returns behaviour log-probs
    R + "free_cache_engine": always(False),
    # the forward-only budget, per pass: rollout.* for the old log-probs, ref.* for the reference
    R + "log_prob_max_token_len_per_gpu": to("@log_prob_max_token_len.rollout"),
    R + "log_prob_micro_batch_size_per_gpu": to("@log_prob_micro_batch_sequences.rollout"),
    R + "log_prob_use_dynamic_bsz": to("@log_prob_dynamic_bsz.rollout"),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": to("@log_prob_max_token_len.ref"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": to("@log_prob_micro_batch_sequences.ref"),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": to("@log_prob_dynamic_bsz.ref"),
    "actor_rollout_ref.hybrid_engine": to("@hybrid_engine"),
    "algorithm.rollout_correction.rollout_is": to("actor.off_policy_correction",
                                                  convert=lambda v: "none" if v is None else v),
    "algorithm.rollout_correction.rollout_is_threshold": to("actor.is_cap"),
    "algorithm.rollout_correction.bypass_mode": to("async_training.use_rollout_log_probs"),
    "critic.optim.lr": to("critic.lr"),
    "critic.optim.lr_warmup_steps": to("critic.warmup_steps", convert=_off_is_zero),
    "critic.optim.clip_grad": to("critic.grad_clip"),
    "critic.strategy": always("fsdp", "fsdp2"),
    "trainer.total_training_steps": to("trainer.total_training_steps", convert=_not_null),
    "trainer.test_freq": to("trainer.test_freq", convert=_off_is_zero),
    "trainer.save_freq": to("trainer.save_freq", convert=_off_is_zero),
    "trainer.max_actor_ckpt_to_keep": to("trainer.max_ckpt_to_keep", convert=_off_is_zero),
    "trainer.default_local_dir": to("trainer.output_dir"),
    "trainer.resume_mode": to("trainer.resume_mode"),
    "trainer.resume_from_path": to("@resume_from_path"),
    "trainer.critic_warmup": always(0),
    "trainer.log_val_generations": to("trainer.log_val_generations"),
    "trainer.rollout_data_dir": to("trainer.rollout_data_dir", convert=lambda v: v or ""),  # null: the run dir
    "trainer.validation_data_dir": to("trainer.validation_data_dir", convert=lambda v: v or ""),
    "custom_reward_function.path": to("@reward_path"),
    "custom_reward_function.name": to("@reward_name"),
    "reward_model.reward_manager": always("naive"),
    "reward_model.sandbox_fusion.url": to("sandbox.url", convert=_not_null),
    "reward_model.sandbox_fusion.memory_limit_mb": to("sandbox.memory_mb"),
    "async_training.compute_prox_log_prob": to("@prox_log_prob"),
}
"""verl key -> where it goes in asyncrl. Every `ours` key exists (a test checks)."""


def _keys(text: str) -> frozenset[str]:
    """`section: leaf leaf ...` lines -> dotted keys (`section.*` alone: the whole subtree)."""
    keys: set[str] = set()
    for line in text.strip().splitlines():
        section, _, leaves = line.partition(":")
        keys.update([f"{section.strip()}.{leaf}" for leaf in leaves.split()] if leaves else [section.strip()])
    return frozenset(keys)


NOT_MODELLED = _keys("""
actor_rollout_ref.actor: ppo_micro_batch_size shuffle data_loader_seed tau_pos tau_neg freeze_vision_tower
actor_rollout_ref.actor: loss_scale_factor calculate_entropy use_prefix_grouper use_torch_compile use_fused_kernels
actor_rollout_ref.actor: entropy_from_logits_with_chunking entropy_checkpointing use_remove_padding rollout_n
actor_rollout_ref.actor: calculate_sum_pi_squared sum_pi_squared_checkpointing optim.optimizer_impl
actor_rollout_ref.actor.optim: override_optimizer_config
actor_rollout_ref.actor.policy_loss: clip_cov_ratio clip_cov_lb clip_cov_ub kl_cov_ratio ppo_kl_coef
actor_rollout_ref.actor.fsdp_config
actor_rollout_ref.actor.megatron
actor_rollout_ref.actor.checkpoint
actor_rollout_ref.actor.profiler
actor_rollout_ref.actor.router_replay
actor_rollout_ref.ref
actor_rollout_ref.model: hf_config_path tokenizer_path use_shm trust_remote_code external_lib exclude_modules
actor_rollout_ref.model: enable_activation_offload lora_adapter_path use_liger use_fused_kernels
actor_rollout_ref.model.override_config
actor_rollout_ref.model.fused_kernel_options
actor_rollout_ref.model.tiled_mlp
actor_rollout_ref.model.mtp
actor_rollout_ref.rollout: name prompt_length response_length dtype enforce_eager
actor_rollout_ref.rollout: cudagraph_capture_sizes data_parallel_size expert_parallel_size max_num_batched_tokens
actor_rollout_ref.rollout: pipeline_model_parallel_size max_model_len enable_chunked_prefill enable_prefix_caching
actor_rollout_ref.rollout: logprobs_mode scheduling_policy load_format log_prob_micro_batch_size disable_log_stats
actor_rollout_ref.rollout: over_sample_rate multi_stage_wake_up skip_rollout skip_dump_dir skip_tokenizer_init
actor_rollout_ref.rollout: enable_rollout_routing_replay quantization quantization_config_file mtp layered_summon
actor_rollout_ref.rollout.val_kwargs: top_k top_p
actor_rollout_ref.rollout.engine_kwargs
actor_rollout_ref.rollout.multi_turn
actor_rollout_ref.rollout.agent
actor_rollout_ref.rollout.checkpoint_engine
actor_rollout_ref.rollout.trace
actor_rollout_ref.rollout.profiler
actor_rollout_ref.rollout.prometheus
actor_rollout_ref: nccl_timeout
actor_rollout_ref.checkpoint_engine
data: tokenizer use_shm val_batch_size tool_config_path return_raw_input_ids return_full_prompt
data: dataloader_num_workers image_patch_size validation_shuffle filter_overlong_prompts_workers image_key
data: video_key trust_remote_code return_multi_modal_inputs
data.custom_cls
data.sampler
data.datagen
data.apply_chat_template_kwargs
algorithm: use_pf_ppo
algorithm.pf_ppo
algorithm.filter_groups: metric
algorithm.rollout_correction: rollout_rs rollout_rs_threshold loss_type rollout_is_batch_normalize
critic: rollout_n enable ppo_mini_batch_size ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz
critic: ppo_max_token_len_per_gpu forward_max_token_len_per_gpu shuffle data_loader_seed loss_agg_mode
critic: forward_micro_batch_size forward_micro_batch_size_per_gpu ulysses_sequence_parallel_size
critic.optim: lr_warmup_steps_ratio total_training_steps weight_decay betas min_lr_ratio num_cycles
critic.optim: lr_scheduler_type warmup_style optimizer optimizer_impl override_optimizer_config
critic.model
critic.checkpoint
critic.profiler
reward_model
reward_manager
trainer: balance_batch total_epochs esi_redundant_time
trainer: val_only default_hdfs_dir del_local_ckpt_after_load max_critic_ckpt_to_keep use_legacy_worker_impl
trainer: ray_wait_register_center_timeout
rollout: total_epochs
async_training: use_trainer_do_validate parallel_validate_and_rollout
async_training.checkpoint_engine
global_profiler
transfer_queue
ray_kwargs
""")
"""verl keys (and whole subtrees) asyncrl knowingly does not model: mostly FSDP, vLLM, Megatron,
profiler and reward-model knobs whose job asyncrl's own engine and trainer do differently."""

VERL_DEFAULTS: dict[str, Any] = {
    "actor.lr": 1e-6, "actor.warmup_steps": -1, "actor.weight_decay": 0.01, "critic.lr": 1e-5,
    "rollout.val_temperature": 0.0, "rollout.val_n": 1, "trainer.test_freq": 0,
    "model.enable_gradient_checkpointing": True,
}
"""verl's defaults (in our units) where they differ from ours in what a run trains, applied under
a command line that uses verl's names so that a recipe leaving them unset trains as in verl."""

ENTRY_POINTS = {"fully_async_main": "fully_async", "one_step_off_policy.main_ppo": "one_step_off",
                "verl.trainer.main_ppo": "colocated", "main_dapo": "colocated"}
"""verl's `python -m` modules (by suffix) -> our pipeline."""


def is_verl_key(key: str) -> bool:
    """A key verl has: in the table, or in (or under) NOT_MODELLED."""
    parts = key.split(".")
    return key in TABLE or any(".".join(parts[:i]) in NOT_MODELLED for i in range(1, len(parts) + 1))


def renamed_keys() -> dict[str, tuple[str, ...]]:
    """verl key -> our keys it sets (for "did you mean")."""
    return {k: tuple(o for o in t.ours if not o.startswith("@")) for k, t in TABLE.items()}


@dataclass
class Translation:
    """A command line in our keys: `values` (dotted key -> value), the verl keys not modelled,
    and whether it used verl's names (then `VERL_DEFAULTS` apply under it)."""

    values: dict[str, Any] = field(default_factory=dict)
    not_modelled: list[str] = field(default_factory=list)
    uses_verl_names: bool = False
    weak: dict[str, Any] = field(default_factory=dict)
    held: dict[str, Any] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)


def translate(pairs: Iterable[tuple[str, Any]], entry: str | None = None) -> Translation:
    """Our keys and values for `(key, value)` pairs that mix ours and verl's (later pairs win;
    hydra's `+key` / `++key` are read as `key`). `entry` is verl's `python -m` module, if known.
    Raises ConfigError for a key that is neither ours nor verl's."""
    t = Translation()
    for raw_key, value in pairs:
        key = raw_key.lstrip("+")
        t.given.add(key)
        ours = key in leaf_keys() or key in section_keys()
        t.uses_verl_names |= not ours
        if key in TABLE:
            _apply(t, key, value)
        elif ours:
            t.values[key] = value
        elif is_verl_key(key) or raw_key.startswith("+"):  # hydra's + adds a key verl's schema lacks
            t.not_modelled.append(key)
        else:
            raise ConfigError(unknown_key_message(key, renamed_keys()))
    _derive(t, entry)
    t.not_modelled = sorted(set(t.not_modelled))
    return t


def _apply(t: Translation, key: str, value: Any) -> None:
    rule = TABLE[key]
    try:
        converted = rule.convert(value)
    except NotModelled:
        t.not_modelled.append(key)
        return
    for our in rule.ours:
        target = t.held if our.startswith("@") else t.weak if rule.weak else t.values
        target[our] = converted


def _derive(t: Translation, entry: str | None) -> None:
    """The settings verl spreads over several keys, then the weak values and verl's defaults."""
    v, held = t.values, t.held
    for key, value in t.weak.items():
        v.setdefault(key, value)
    _micro_batch(v, held)
    _log_prob_micro_batch(v, held)
    _mixed_precision(t)
    _pipeline(t, entry)
    if v.get("data.train_batch_size") == 0 and t.uses_verl_names:  # fully async: one update's prompts
        v["data.train_batch_size"] = _get(v, "actor.ppo_mini_batch_size") * _get(v, "async_training.require_batches")
    if held.get("@prox_log_prob"):  # old log-probs from the proximal policy, IS weights to the behaviour's
        v["async_training.use_rollout_log_probs"] = False
    if held.get("@val_do_sample") is False:
        v["rollout.val_temperature"] = 0.0  # greedy
    if held.get("@reward_path"):
        v["reward.custom_function"] = f"{held['@reward_path']}:{held.get('@reward_name') or 'compute_score'}"
    if v.get("trainer.resume_mode") == "resume_path":
        if not held.get("@resume_from_path"):
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        v["trainer.resume_mode"] = held["@resume_from_path"]
    if "sandbox.url" in v:
        v.setdefault("sandbox.backend", "http")
    if t.uses_verl_names:
        for key, value in VERL_DEFAULTS.items():
            v.setdefault(key, value)


def _micro_batch(v: dict[str, Any], held: dict[str, Any]) -> None:
    """verl's micro-batch: with use_dynamic_bsz a token budget per GPU (ours, in tokens), else
    sequences per GPU, which hold at most max_prompt_length + max_response_length tokens each."""
    if "actor.ppo_micro_batch_tokens" in v:
        return
    if held.get("@dynamic_bsz"):
        v["actor.ppo_micro_batch_tokens"] = held.get("@max_token_len", 16384)  # verl's default
    elif held.get("@micro_batch_sequences"):
        longest = _get(v, "data.max_prompt_length") + _get(v, "data.max_response_length")
        v["actor.ppo_micro_batch_tokens"] = held["@micro_batch_sequences"] * longest


def _log_prob_micro_batch(v: dict[str, Any], held: dict[str, Any]) -> None:
    """verl's forward-only budget of each pass (rollout.*: old log-probs, ref.*: the reference),
    as `_micro_batch` reads the training one (log_prob_use_dynamic_bsz defaults to the actor's
    use_dynamic_bsz); ours is one budget for both passes: the smaller. Where verl's keys leave it
    unset (verl then uses the training budget) ours stays 0: twice the training budget."""
    if "actor.log_prob_micro_batch_tokens" in v:
        return
    longest = _get(v, "data.max_prompt_length") + _get(v, "data.max_response_length")
    budgets = []
    for p in ("rollout", "ref"):
        dynamic = held.get(f"@log_prob_dynamic_bsz.{p}", held.get("@dynamic_bsz"))
        if dynamic and f"@log_prob_max_token_len.{p}" in held:
            budgets.append(held[f"@log_prob_max_token_len.{p}"])
        elif not dynamic and held.get(f"@log_prob_micro_batch_sequences.{p}"):
            budgets.append(held[f"@log_prob_micro_batch_sequences.{p}"] * longest)
    if budgets:
        v["actor.log_prob_micro_batch_tokens"] = min(budgets)


def _mixed_precision(t: Translation) -> None:
    """verl's FSDP `param_dtype` (`fsdp_config.mixed_precision.param_dtype`, else `fsdp_config.dtype`):
    bf16 is bf16 compute over float32 masters, our `model.dtype=bfloat16` with
    `model.mixed_precision=param_dtype` (unless ours are given); float32 (no mixed precision, and
    so float32 engines here, where `model.dtype` is the engines' dtype too) is not modelled."""
    keys = (A + "fsdp_config.mixed_precision.param_dtype", A + "fsdp_config.dtype")  # verl's precedence
    given = [(key, t.held[f"@param_dtype.{key}"]) for key in keys if f"@param_dtype.{key}" in t.held]
    if not given:
        return
    key, dtype = given[0]
    if str(dtype) not in BF16:
        t.not_modelled.append(key)
        return
    t.values.setdefault("model.dtype", "bfloat16")
    t.values.setdefault("model.mixed_precision", "param_dtype")


def _pipeline(t: Translation, entry: str | None) -> None:
    """verl picks the pipeline by its entry module; its command line says it by
    hybrid_engine=False (decoupled) and fully-async keys."""
    if "pipeline" in t.values:
        return
    by_entry = [p for suffix, p in ENTRY_POINTS.items() if entry and entry.endswith(suffix)]
    hybrid = t.held.get("@hybrid_engine")
    if by_entry:
        t.values["pipeline"] = by_entry[0]
    elif hybrid is False:
        fully = any(k.startswith("async_training.") or k in ("rollout.total_rollout_steps", "rollout.test_freq")
                    for k in t.given)
        t.values["pipeline"] = "fully_async" if fully else "one_step_off"


def _get(values: dict[str, Any], key: str) -> Any:
    """A key's value in `values`, else our default."""
    return values.get(key, leaf_keys()[key])


def warn_not_modelled(keys: list[str]) -> None:
    if keys:
        log.warning("verl keys asyncrl does not model, ignored (see docs/migrating.md): %s", ", ".join(keys))
