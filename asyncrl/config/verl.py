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
asyncrl's defaults, which are sized for the built-in tiny model, except that any other model gets
`VERL_DEFAULTS` (learning rate, warm-up, weight decay, greedy validation, lengths): the defaults
depend on the model, never on how a key is spelled. A command line that asks for GPUs
(`n_gpus_per_node` > 0) runs on CUDA unless it sets `trainer.device`. docs/migrating.md explains
each difference. Keys are as of verl b178a3cd (2026-01, `verl/trainer/config/ppo_trainer.yaml`
and the one-step-off / fully-async recipe configs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.keys import leaf_keys, section_keys, unknown_key_message
from asyncrl.config.verl_knobs import NOT_MODELLED
from asyncrl.errors import ConfigError

log = logging.getLogger("asyncrl.config")


class NotModelled(Exception):
    """A verl value asyncrl has no equivalent of (the key then goes into the warning). With a
    `fix` (every `always` key), the value changes what is trained: `asyncrl train` refuses it."""

    def __init__(self, fix: str = "") -> None:
        super().__init__(fix)
        self.fix = fix


def _same(value: Any) -> Any:
    return value


def _off_is_zero(value: Any) -> Any:
    """verl's -1 / null (off, never) is our 0."""
    return 0 if value is None or (isinstance(value, int) and value < 0) else value


NO_LIMIT = 1_000_000
"""verl's null turn limits (none): the response budget ends an episode long before."""


def _no_limit(value: Any) -> Any:
    return NO_LIMIT if value is None else value


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
    fixed: tuple[Any, ...] = ()
    """`always`: the values asyncrl runs with (another changes what is trained)."""


def to(*ours: str, convert: Callable[[Any], Any] = _same, weak: bool = False) -> To:
    return To(ours, convert, weak)


def always(*values: Any, fix: str = "") -> To:
    """A verl setting asyncrl always has with one of `values`; any other value would change what is
    trained, so `asyncrl train` refuses it, naming `fix` (default: the value asyncrl runs with)."""
    def check(value: Any) -> Any:
        if value not in values:
            raise NotModelled(fix or f"asyncrl always runs it as {values[0]!r}; set that or drop the key")
        return value
    return To((), check, fixed=values)


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
    "data.filter_overlong_prompts": to("data.filter_overlong_prompts"),  # (verl's default false; ours true)
    "data.truncation": to("data.truncation"),
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
    A + "use_torch_compile": to("actor.use_torch_compile"),  # verl compiles its log-prob math; we, the layers
    A + "strategy": always("fsdp", "fsdp2"),  # the GPU trainer is FSDP2
    # FSDP mixed precision: bf16 parameters over float32 masters is our model.mixed_precision=param_dtype
    A + "fsdp_config.dtype": to("@param_dtype." + A + "fsdp_config.dtype"),
    A + "fsdp_config.mixed_precision.param_dtype": to("@param_dtype." + A + "fsdp_config.mixed_precision.param_dtype"),
    A + "fsdp_config.mixed_precision.reduce_dtype": always(*FLOAT32),  # gradients reduce in float32
    A + "fsdp_config.mixed_precision.buffer_dtype": always(*FLOAT32),  # buffers stay float32
    A + "fsdp_config.model_dtype": always(*FLOAT32),  # float32 master weights
    A + "ulysses_sequence_parallel_size": always(1, fix="asyncrl has no sequence parallelism; set it to 1 (long "
                                                "rows fit through actor.ppo_micro_batch_tokens and checkpointing)"),
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
    "actor_rollout_ref.model.override_config.max_position_embeddings": to("model.max_position_embeddings"),
    R + "val_kwargs.top_p": to("rollout.val_top_p"),
    R + "val_kwargs.top_k": to("rollout.val_top_k", convert=lambda v: -1 if v is None or v <= 0 else v),
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
    "actor_rollout_ref.ref.use_torch_compile": to("actor.use_torch_compile", weak=True),  # one key for both
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
    "reward_model.enable": to("@rm_enable"),  # with model.path: reward.model_path, scoring alone (as verl)
    "reward_model.model.path": to("@rm_path"),
    "reward_model.micro_batch_size_per_gpu": to("reward.model_batch_size", convert=_not_null),
    "reward_model.micro_batch_size": to("reward.model_batch_size", convert=_not_null, weak=True),  # verl's older one
    "reward_model.max_length": to("reward.model_max_length", convert=_off_is_zero),
    "trainer.val_only": always(False, fix="to score a model without training, run `asyncrl eval` with these arguments"),
    R + "multi_turn.enable": to("rollout.multi_turn.enable"),
    R + "multi_turn.max_assistant_turns": to("rollout.multi_turn.max_assistant_turns", convert=_no_limit),
    R + "multi_turn.max_user_turns": to("rollout.multi_turn.max_user_turns", convert=_no_limit),
    R + "multi_turn.max_parallel_calls": to("rollout.multi_turn.max_parallel_calls"),
    R + "multi_turn.tool_config_path": to("rollout.multi_turn.tool_config_path", convert=lambda v: v or ""),
    R + "multi_turn.format": to("rollout.multi_turn.format"),
    R + "multi_turn.max_tool_response_length": to("rollout.multi_turn.max_tool_response_length"),
    R + "multi_turn.tool_response_truncate_side": always("left", fix="asyncrl keeps the head of a long tool output "
                                                         "(verl's left); set it to left"),
    R + "multi_turn.interaction_config_path": always(None, fix="interactions (a simulated user) are not built; write "
                                                     "the environment as an episode: rollout.multi_turn.episode"),
    R + "multi_turn.num_repeat_rollouts": always(None, fix="interactions are not built; drop the key"),
    "algorithm.use_pf_ppo": always(False, fix="PF-PPO's reweighted sampling is not built; set it false"),
    M + "lora_adapter_path": always(None, fix="start from the adapter merged into the model at model.path"),
    A + "loss_scale_factor": always(None, fix="asyncrl scales the loss by loss_agg_mode alone; drop the key"),
    R + "over_sample_rate": always(0, 0.0, fix="asyncrl trains every sample it generates (tail batching is its "
                                   "long-tail remedy: tail_batching.enable); set it to 0"),
    "data.custom_cls.path": always(None, fix="load the data as verl-layout parquet/JSONL (data.train_files)"),
    "data.sampler.class_path": always(None, fix="asyncrl samples prompts itself (data.shuffle)"),
    "data.datagen.path": always(None, fix="generate the data beforehand into data.train_files"),
    "algorithm.rollout_correction.rollout_rs": always(None, fix="no rejection sampling here; use "
                                                      "actor.off_policy_correction (rollout_is) instead"),
    "algorithm.rollout_correction.rollout_rs_threshold": always(None, fix="no rejection sampling here"),
    "algorithm.rollout_correction.loss_type": always("ppo_clip", fix="asyncrl's loss is PPO's clipped one"),
    "algorithm.rollout_correction.rollout_is_batch_normalize": always(False, fix="not modelled; set it false"),
    "reward_model.reward_manager": always("naive", "dapo"),  # dapo: naive plus the overlong punishment below
    **{f"{prefix}.{name}": to(f"@overlong.{name}") for prefix in ("reward_model.overlong_buffer",
       "reward_model.reward_kwargs.overlong_buffer_cfg") for name in ("enable", "len", "penalty_factor")},
    "reward_model.overlong_buffer.log": always(True, False),  # the penalty is always in the reward's details
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": always(True, False),
    "reward_model.reward_kwargs.max_resp_len": to("reward.overlong_max_len"),
    "reward_model.sandbox_fusion.url": to("sandbox.url", convert=_not_null),
    "reward_model.sandbox_fusion.memory_limit_mb": to("sandbox.memory_mb"),
    "async_training.compute_prox_log_prob": to("@prox_log_prob"),
}
"""verl key -> where it goes in asyncrl. Every `ours` key exists (a test checks)."""


VERL_DEFAULTS: dict[str, Any] = {
    "actor.lr": 1e-6, "actor.warmup_steps": -1, "actor.weight_decay": 0.01, "critic.lr": 1e-5,
    "rollout.val_temperature": 0.0, "rollout.val_n": 1, "trainer.test_freq": 0,
    "model.enable_gradient_checkpointing": True, "data.max_prompt_length": 512, "data.max_response_length": 512,
}
"""verl's defaults (in our units) where they differ from ours in what a run trains, applied to every
model but the built-in toy ones (`TOY_MODELS`, whose defaults are ours), whatever names the command line uses."""
TINY = "tiny"
"""The built-in toy model (`model.path`'s default), which keeps asyncrl's own defaults."""
TOY_MODELS = (TINY, "tiny-tools", "tiny-countdown", "tiny-longtail")
"""The built-in toy models (the others are tiny warmed on one task), which keep asyncrl's own defaults."""

OVERRIDE_CONFIG = "actor_rollout_ref.model.override_config."
"""verl's overrides of the model's HF config; only max_position_embeddings is modelled."""
CHAT_KWARGS = "data.apply_chat_template_kwargs."
"""verl's chat-template variables (`+data.apply_chat_template_kwargs.enable_thinking=False`), each one
entry `name=value` of our data.chat_template_kwargs."""

ENTRY_POINTS = {"fully_async_main": "fully_async", "one_step_off_policy.main_ppo": "one_step_off",
                "verl.trainer.main_ppo": "colocated", "main_dapo": "colocated"}
"""verl's `python -m` modules (by suffix) -> our pipeline."""


def is_verl_key(key: str) -> bool:
    """A key verl has: in the table, or in (or under) NOT_MODELLED."""
    parts = key.split(".")
    in_not_modelled = any(".".join(parts[:i]) in NOT_MODELLED for i in range(1, len(parts) + 1))
    return key in TABLE or f"{key}.".startswith(CHAT_KWARGS) or in_not_modelled


def renamed_keys() -> dict[str, tuple[str, ...]]:
    """verl key -> our keys it sets (for "did you mean")."""
    return {k: tuple(o for o in t.ours if not o.startswith("@")) for k, t in TABLE.items()}


@dataclass
class Translation:
    """A command line in our keys: `values` (dotted key -> value), the verl keys not modelled,
    and whether it used verl's names (then GPU counts mean CUDA, and `train` needs a model path)."""

    values: dict[str, Any] = field(default_factory=dict)
    not_modelled: list[str] = field(default_factory=list)
    changes_training: dict[str, str] = field(default_factory=dict)
    """The not-modelled keys whose value would change what is trained -> `key=value: the fix`."""
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
        if f"{key}.".startswith(CHAT_KWARGS):  # verl's dict: the key itself, or one per template variable
            _chat_kwargs(t, key, value)
        elif key.startswith(OVERRIDE_CONFIG) and key not in TABLE:  # the model itself changes
            t.not_modelled.append(key)
            t.changes_training[key] = (f"{key}={value!r} changes what is trained and is not modelled: set it in the "
                                       f"model's config.json (model.max_position_embeddings is the one override)")
        elif key in TABLE:
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


def _chat_kwargs(t: Translation, key: str, value: Any) -> None:
    """verl's apply_chat_template_kwargs (a dict, or one variable per key) as `name=value` entries."""
    items = value.items() if f"{key}." == CHAT_KWARGS and isinstance(value, dict) else [(key[len(CHAT_KWARGS):], value)]
    pairs = tuple(f"{name}={json.dumps(v)}" for name, v in items)
    t.values["data.chat_template_kwargs"] = (*t.values.get("data.chat_template_kwargs", ()), *pairs)


def _apply(t: Translation, key: str, value: Any) -> None:
    rule = TABLE[key]
    try:
        converted = rule.convert(value)
    except NotModelled as exc:
        t.not_modelled.append(key)
        if exc.fix:
            t.changes_training[key] = f"{key}={value!r} changes what is trained and is not modelled: {exc.fix}"
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
    if held.get("@overlong.enable"):  # DAPO's two spellings (its YAML and the recipes' reward_kwargs)
        v.setdefault("reward.overlong_buffer", held.get("@overlong.len", 0))
        v.setdefault("reward.overlong_penalty_factor", held.get("@overlong.penalty_factor", 1.0))
    if held.get("@rm_enable"):  # verl's reward manager then returns the reward model's scores alone
        if not held.get("@rm_path"):
            raise ConfigError("reward_model.enable=True needs reward_model.model.path: a local sequence classifier")
        v.setdefault("reward.model_path", held["@rm_path"])
        v.setdefault("reward.rule_weight", 0.0)
    if held.get("@reward_path"):
        v["reward.custom_function"] = f"{held['@reward_path']}:{held.get('@reward_name') or 'compute_score'}"
    if v.get("trainer.resume_mode") == "resume_path":
        if not held.get("@resume_from_path"):
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        v["trainer.resume_mode"] = held["@resume_from_path"]
    if "sandbox.url" in v:
        v.setdefault("sandbox.backend", "http")
    if "actor.warmup_ratio" in v:  # a ratio given means warm-up by ratio (steps -1), as verl's lr_warmup_steps=-1
        v.setdefault("actor.warmup_steps", -1)
    if v.get("data.truncation", "error") != "error":  # a cut asked for is made, not a drop (verl filters if told)
        v.setdefault("data.filter_overlong_prompts", False)
    if v.get("model.path", TINY) not in TOY_MODELS:
        for key, value in VERL_DEFAULTS.items():
            v.setdefault(key, value)
    gpus = any((v.get(f"{side}.n_gpus_per_node") or 0) > 0 for side in ("trainer", "rollout"))
    if t.uses_verl_names and gpus:
        v.setdefault("trainer.device", "cuda")  # a recipe sized in GPUs runs on them (preflight says if none)


def _micro_batch(v: dict[str, Any], held: dict[str, Any]) -> None:
    """verl's micro-batch: with use_dynamic_bsz a token budget per GPU (ours, in tokens), else
    sequences per GPU, which hold at most max_prompt_length + max_response_length tokens each."""
    if "actor.ppo_micro_batch_tokens" in v:
        return
    longest = _longest(v)
    if held.get("@dynamic_bsz"):
        v["actor.ppo_micro_batch_tokens"] = _count(held.get("@max_token_len", 16384), A + "ppo_max_token_len_per_gpu")
    elif held.get("@micro_batch_sequences") and longest:
        sequences = _count(held["@micro_batch_sequences"], A + "ppo_micro_batch_size_per_gpu")
        v["actor.ppo_micro_batch_tokens"] = sequences * longest


def _longest(v: dict[str, Any]) -> int | None:
    """max_prompt_length + max_response_length, or None where one is not a number (validation says so)."""
    lengths = [_get(v, "data.max_prompt_length"), _get(v, "data.max_response_length")]
    return sum(lengths) if all(isinstance(n, int) and not isinstance(n, bool) for n in lengths) else None


def _count(value: Any, key: str) -> int:
    """A verl micro-batch size or token budget: a positive whole number, else one line naming the key."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value!r}: must be a whole number >= 1")
    return value


def _log_prob_micro_batch(v: dict[str, Any], held: dict[str, Any]) -> None:
    """verl's forward-only budget of each pass (rollout.*: old log-probs, ref.*: the reference),
    as `_micro_batch` reads the training one (log_prob_use_dynamic_bsz defaults to the actor's
    use_dynamic_bsz); ours is one budget for both passes: the smaller. Where verl's keys leave it
    unset (verl then uses the training budget) ours stays 0: twice the training budget."""
    longest = _longest(v)
    if "actor.log_prob_micro_batch_tokens" in v or longest is None:
        return
    budgets = []
    for p in ("rollout", "ref"):
        dynamic = held.get(f"@log_prob_dynamic_bsz.{p}", held.get("@dynamic_bsz"))
        where = R if p == "rollout" else "actor_rollout_ref.ref."
        if dynamic and f"@log_prob_max_token_len.{p}" in held:
            budgets.append(_count(held[f"@log_prob_max_token_len.{p}"], where + "log_prob_max_token_len_per_gpu"))
        elif not dynamic and held.get(f"@log_prob_micro_batch_sequences.{p}"):
            key = where + "log_prob_micro_batch_size_per_gpu"
            budgets.append(_count(held[f"@log_prob_micro_batch_sequences.{p}"], key) * longest)
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


def warn_not_modelled(t: Translation) -> None:
    """One warning per class: the keys that change what is trained (`asyncrl train` refuses them;
    `sim` and `config` plan the recipe as if they were unset), then the engine and memory knobs."""
    changing = [k for k in t.not_modelled if k in t.changes_training]
    knobs = [k for k in t.not_modelled if k not in t.changes_training]
    if changing:
        log.warning("verl keys that change what is trained, not modelled (asyncrl train refuses them; see "
                    "docs/migrating.md): %s", ", ".join(changing))
    if knobs:
        log.warning("verl engine and memory knobs with no effect here, ignored (see docs/migrating.md): %s",
                    ", ".join(knobs))
