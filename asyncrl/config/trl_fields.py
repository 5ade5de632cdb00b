"""Every TRL `GRPOConfig` field (with `TrainingArguments`'), its TRL default and what asyncrl does with it.

The rule (`asyncrl.config.trl_map` applies it): a field left at TRL's default is accepted whatever it
is; a field given a value is either mapped to asyncrl's keys with TRL's semantics (`MAPPED`),
accepted because it is bookkeeping that changes neither what is trained nor what is measured
(`KEPT`: run and hub names, logging, saving and evaluation cadence, reporting), or refused in one
line saying why (`REFUSED`). `DEFAULTS` are TRL 1.16's (trl's `GRPOConfig` plus the `ModelConfig`
LoRA names scripts pass along, and `max_prompt_length`/`warmup_ratio` of older TRL and
transformers); tests/config/test_trl_fields.py walks the installed `GRPOConfig` so that a field
TRL adds cannot stay unclassified here.

Imports nothing: `asyncrl.config` stays light.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # TrainingArguments
    "output_dir": None, "per_device_train_batch_size": 8, "num_train_epochs": 3.0, "max_steps": -1,
    "learning_rate": 1e-06, "lr_scheduler_type": "linear", "lr_scheduler_kwargs": None, "warmup_steps": 0,
    "optim": "adamw_torch_fused", "optim_args": None, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
    "adam_epsilon": 1e-08, "optim_target_modules": None, "gradient_accumulation_steps": 1,
    "average_tokens_across_devices": True, "max_grad_norm": 1.0, "label_smoothing_factor": 0.0, "bf16": None,
    "fp16": False, "bf16_full_eval": False, "fp16_full_eval": False, "tf32": None, "activation_checkpointing": None,
    "activation_checkpointing_kwargs": None, "gradient_checkpointing": True, "gradient_checkpointing_kwargs": None,
    "torch_compile": False, "torch_compile_backend": None, "torch_compile_mode": None, "use_liger_kernel": False,
    "liger_kernel_config": None, "use_cache": False, "neftune_noise_alpha": None, "torch_empty_cache_steps": None,
    "auto_find_batch_size": False, "logging_strategy": "steps", "logging_steps": 10, "logging_first_step": False,
    "log_on_each_node": True, "logging_nan_inf_filter": True, "include_num_input_tokens_seen": "no",
    "log_level": "passive", "log_level_replica": "warning", "disable_tqdm": None, "report_to": "none",
    "run_name": None, "project": "huggingface", "trackio_space_id": None, "trackio_bucket_id": None,
    "trackio_static_space_id": None, "eval_strategy": "no", "eval_steps": None, "eval_delay": 0,
    "per_device_eval_batch_size": 8, "prediction_loss_only": False, "eval_on_start": False,
    "eval_do_concat_batches": True, "eval_use_gather_object": False, "eval_accumulation_steps": None,
    "include_for_metrics": [], "batch_eval_metrics": False, "save_only_model": False, "save_strategy": "steps",
    "save_steps": 500, "save_on_each_node": False, "save_total_limit": None, "enable_jit_checkpoint": False,
    "push_to_hub": False, "hub_token": None, "hub_private_repo": None, "hub_model_id": None,
    "hub_strategy": "every_save", "hub_always_push": False, "hub_revision": None, "load_best_model_at_end": False,
    "metric_for_best_model": None, "greater_is_better": None, "ignore_data_skip": False,
    "restore_callback_states_from_checkpoint": False, "full_determinism": False, "seed": 42, "data_seed": None,
    "use_cpu": False, "accelerator_config": None, "parallelism_config": None, "dataloader_drop_last": False,
    "dataloader_num_workers": 0, "dataloader_pin_memory": True, "dataloader_persistent_workers": False,
    "dataloader_prefetch_factor": None, "dataloader_multiprocessing_context": None, "dataloader_in_order": True,
    "remove_unused_columns": False, "label_names": None, "train_sampling_strategy": "random",
    "length_column_name": "length", "ddp_find_unused_parameters": None, "ddp_bucket_cap_mb": None,
    "ddp_broadcast_buffers": None, "ddp_static_graph": None, "ddp_backend": None, "ddp_timeout": 1800,
    "fsdp": None, "fsdp_config": None, "deepspeed": None, "debug": "", "skip_memory_metrics": True,
    "do_train": False, "do_eval": False, "do_predict": False, "resume_from_checkpoint": None, "local_rank": -1,
    # GRPOConfig's own
    "model_init_kwargs": None, "trust_remote_code": False, "router_aux_loss_coef": None, "disable_dropout": False,
    "cast_lm_head_to_fp32": False, "num_generations": 8, "num_generations_eval": None,
    "max_completion_length": 512, "ds3_gather_for_generation": True, "shuffle_dataset": True,
    "pad_to_multiple_of": "auto", "generation_batch_size": None, "steps_per_generation": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": 0, "min_p": None, "generation_kwargs": None, "chat_template_kwargs": None,
    "repetition_penalty": 1.0, "cache_implementation": None, "use_vllm": False, "vllm_mode": "colocate",
    "vllm_model_impl": "vllm", "vllm_enable_sleep_mode": False, "vllm_structured_outputs_regex": None,
    "vllm_server_base_url": None, "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000,
    "vllm_server_timeout": 240.0, "vllm_group_port": 51216, "vllm_gpu_memory_utilization": 0.3,
    "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1, "beta": 0.0, "num_iterations": 1,
    "epsilon": 0.2, "delta": None, "epsilon_high": None, "sapo_temperature_neg": 1.05, "sapo_temperature_pos": 1.0,
    "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
    "importance_sampling_level": "token", "reward_weights": None,
    "multi_objective_aggregation": "sum_then_normalize", "scale_rewards": "group", "loss_type": "dapo",
    "mask_truncated_completions": False, "sync_ref_model": False, "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
    "max_tool_calling_iterations": None, "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "off_policy_mask_threshold": None, "use_bias_correction_kl": True,
    "log_completions": False, "log_multimodal": True, "num_completions_to_print": None,
    "log_unique_prompts": False, "log_completions_hub_repo": None, "use_transformers_continuous_batching": False,
    "transformers_continuous_batching_config": None, "use_transformers_paged": False,
    "vllm_importance_sampling_cap": None,
    # TRL's ModelConfig (LoRA), and names of older TRL / transformers releases
    "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    "max_prompt_length": 512, "warmup_ratio": 0.0,
}
"""TRL's default of every field asyncrl knows, in TRL's order."""

MAPPED: dict[str, str] = {
    "output_dir": "trainer.output_dir",
    "per_device_train_batch_size": "data.train_batch_size, actor.ppo_mini_batch_size",
    "gradient_accumulation_steps": "actor.ppo_mini_batch_size", "generation_batch_size": "data.train_batch_size",
    "steps_per_generation": "data.train_batch_size", "num_train_epochs": "trainer.total_training_steps",
    "max_steps": "trainer.total_training_steps", "learning_rate": "actor.lr", "lr_scheduler_type": "actor.lr_scheduler",
    "warmup_steps": "actor.warmup_steps (< 1: actor.warmup_ratio)", "warmup_ratio": "actor.warmup_ratio",
    "optim": "AdamW (adamw_torch, adamw_torch_fused)", "weight_decay": "actor.weight_decay",
    "adam_beta1": "actor.betas", "adam_beta2": "actor.betas", "max_grad_norm": "actor.grad_clip",
    "bf16": "model.dtype (false: float32)", "activation_checkpointing": "model.enable_gradient_checkpointing",
    "gradient_checkpointing": "model.enable_gradient_checkpointing", "torch_compile": "actor.use_torch_compile",
    "report_to": "trainer.logger", "run_name": "trainer.experiment_name", "project": "trainer.project_name",
    "eval_strategy": "trainer.test_freq", "eval_steps": "trainer.test_freq",
    "eval_on_start": "trainer.val_before_train",
    "save_strategy": "trainer.save_freq", "save_steps": "trainer.save_freq",
    "save_total_limit": "trainer.max_ckpt_to_keep",
    "seed": "seed", "use_cpu": "trainer.device=cpu", "train_sampling_strategy": "data.shuffle",
    "model_init_kwargs": "model.dtype ({'dtype': ...})", "num_generations": "rollout.n",
    "num_generations_eval": "rollout.val_n", "max_completion_length": "data.max_response_length",
    "max_prompt_length": "data.max_prompt_length", "shuffle_dataset": "data.shuffle",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p", "top_k": "rollout.top_k (0: -1)", "chat_template_kwargs": "data.chat_template_kwargs",
    "use_vllm": "(none: asyncrl's own engine)", "vllm_mode": "(none: pipeline=one_step_off|fully_async)",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "rollout.tensor_model_parallel_size",
    "beta": "actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type=k3", "num_iterations": "actor.ppo_epochs",
    "epsilon": "actor.clip_ratio_low (and high without epsilon_high)", "epsilon_high": "actor.clip_ratio_high",
    "importance_sampling_level": "actor.policy_loss (sequence: gspo)", "reward_weights": "reward.function_weights",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo", "loss_type": "actor.loss_agg_mode, actor.policy_loss",
    "entropy_coef": "actor.entropy_coeff", "num_completions_to_print": "trainer.log_generations",
    "use_peft": "model.lora_rank", "lora_r": "model.lora_rank", "lora_alpha": "model.lora_alpha",
    "lora_target_modules": "model.target_modules",
}
"""Fields whose value becomes asyncrl keys (`trl_map.grpo_settings`), with the keys they set."""

KEPT: frozenset[str] = frozenset({
    "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
    "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "skip_memory_metrics",
    "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "log_completions", "log_multimodal",
    "log_unique_prompts", "log_completions_hub_repo", "push_to_hub", "hub_token", "hub_private_repo",
    "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision", "save_only_model", "save_on_each_node",
    "enable_jit_checkpoint", "per_device_eval_batch_size", "eval_do_concat_batches", "eval_use_gather_object",
    "eval_accumulation_steps", "prediction_loss_only", "do_train", "do_eval", "do_predict", "local_rank",
    "remove_unused_columns", "length_column_name", "dataloader_num_workers", "dataloader_pin_memory",
    "dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
    "vllm_model_impl", "vllm_enable_sleep_mode", "ddp_timeout",
})
"""Bookkeeping: names, logging/saving/evaluation cadence and batching, reporting, hub uploads (asyncrl
uploads nothing: it says so), the data loader's and the vLLM server's plumbing. None changes what is
trained or measured; remove_unused_columns too: every column reaches the reward functions either way."""

_ENGINE = "asyncrl generates with its own engine (rollout.*); it has no such setting"
_PARALLEL = "asyncrl places workers itself (backend=processes trainer.ranks=N trains with FSDP2; docs/scaling.md)"
_LOSS = "not one of asyncrl's losses (actor.policy_loss: vanilla, gspo, cispo, gpg)"
_PRECISION = "asyncrl computes in model.dtype (float32 or bfloat16) over float32 masters"
_EVAL = "asyncrl validates on eval_dataset every trainer.test_freq steps with rollout.val_n samples; no such setting"
_OPTIM = "asyncrl trains with AdamW (actor.lr, actor.betas, actor.weight_decay); no such setting"
_REF = "asyncrl's reference model is the initial policy, frozen (actor.use_kl_loss)"
_ENTROPY = "asyncrl's entropy bonus is a fixed actor.entropy_coeff"
_IS = "asyncrl's off-policy correction is actor.off_policy_correction with actor.is_cap"
_CKPT = "asyncrl resumes from trainer.output_dir's last checkpoint exactly (trainer.resume_mode)"

REFUSED: dict[str, str] = {
    "lr_scheduler_kwargs": "asyncrl's schedules take actor.min_lr_ratio only", "optim_args": _OPTIM,
    "adam_epsilon": "asyncrl's AdamW keeps eps=1e-8", "optim_target_modules": _OPTIM,
    "average_tokens_across_devices": "asyncrl averages over the whole mini-batch (actor.loss_agg_mode)",
    "label_smoothing_factor": "GRPO has no labels to smooth", "fp16": _PRECISION, "bf16_full_eval": _PRECISION,
    "fp16_full_eval": _PRECISION, "tf32": "asyncrl leaves torch's matmul precision as it is",
    "activation_checkpointing_kwargs": "asyncrl checkpoints each decoder layer its own way",
    "gradient_checkpointing_kwargs": "asyncrl checkpoints each decoder layer its own way",
    "torch_compile_backend": "asyncrl compiles each decoder layer with inductor (actor.use_torch_compile)",
    "torch_compile_mode": "asyncrl compiles each decoder layer with inductor (actor.use_torch_compile)",
    "use_liger_kernel": "asyncrl has its own fused kernels (model.packed_attention, rollout.fused_decode)",
    "liger_kernel_config": "asyncrl has its own fused kernels (model.packed_attention, rollout.fused_decode)",
    "use_cache": "asyncrl's trainer never uses a KV cache and its engine always does",
    "neftune_noise_alpha": "asyncrl adds no embedding noise", "torch_empty_cache_steps": _ENGINE,
    "auto_find_batch_size": "TRL's GRPO refuses it too: the batch must hold whole groups",
    "eval_delay": _EVAL, "include_for_metrics": _EVAL, "batch_eval_metrics": _EVAL,
    "load_best_model_at_end": "asyncrl keeps the last trainer.max_ckpt_to_keep checkpoints, not a best one",
    "metric_for_best_model": "asyncrl keeps the last trainer.max_ckpt_to_keep checkpoints, not a best one",
    "greater_is_better": "asyncrl keeps the last trainer.max_ckpt_to_keep checkpoints, not a best one",
    "ignore_data_skip": _CKPT, "restore_callback_states_from_checkpoint": "asyncrl takes no callbacks",
    "resume_from_checkpoint": _CKPT, "full_determinism": "asyncrl seeds from seed; no deterministic-kernel mode",
    "data_seed": "asyncrl shuffles the data with seed", "accelerator_config": _PARALLEL,
    "parallelism_config": _PARALLEL, "dataloader_drop_last": "asyncrl's data stream runs across epochs",
    "dataloader_in_order": "asyncrl's data stream is its own", "label_names": "GRPO has no labels",
    "ddp_find_unused_parameters": _PARALLEL, "ddp_bucket_cap_mb": _PARALLEL, "ddp_broadcast_buffers": _PARALLEL,
    "ddp_static_graph": _PARALLEL, "ddp_backend": _PARALLEL, "fsdp": _PARALLEL, "fsdp_config": _PARALLEL,
    "deepspeed": _PARALLEL, "debug": "asyncrl has no such debug mode (asyncrl train --debug shows tracebacks)",
    "trust_remote_code": "asyncrl loads transformers' own architectures only; no remote code runs",
    "router_aux_loss_coef": "asyncrl has no mixture-of-experts loss",
    "disable_dropout": "asyncrl trains with the model's own dropout settings",
    "cast_lm_head_to_fp32": _PRECISION, "ds3_gather_for_generation": _PARALLEL,
    "pad_to_multiple_of": "asyncrl packs rows without padding",
    "min_p": _ENGINE, "generation_kwargs": _ENGINE, "repetition_penalty": _ENGINE, "cache_implementation": _ENGINE,
    "vllm_structured_outputs_regex": _ENGINE, "vllm_max_model_length": _ENGINE,
    "delta": "asyncrl's extra clip is dual-clip on negative advantages (actor.clip_ratio_c), not TRL's delta",
    "sapo_temperature_neg": _LOSS, "sapo_temperature_pos": _LOSS, "vespo_k_pos": _LOSS, "vespo_lambda_pos": _LOSS,
    "vespo_k_neg": _LOSS, "vespo_lambda_neg": _LOSS,
    "multi_objective_aggregation": "asyncrl sums the weighted rewards, then normalises per group",
    "mask_truncated_completions": "asyncrl trains on truncated completions (reward.overlong_buffer penalises them)",
    "sync_ref_model": _REF, "ref_model_mixup_alpha": _REF, "ref_model_sync_steps": _REF,
    "top_entropy_quantile": "asyncrl trains on every completion token", "use_adaptive_entropy": _ENTROPY,
    "entropy_coef_min": _ENTROPY, "entropy_coef_max": _ENTROPY, "entropy_coef_delta": _ENTROPY,
    "entropy_target": _ENTROPY, "max_tool_calling_iterations": "tools run as rollout.multi_turn.* episodes",
    "vllm_importance_sampling_correction": _IS, "vllm_importance_sampling_mode": _IS,
    "vllm_importance_sampling_clip_max": _IS, "vllm_importance_sampling_clip_min": _IS,
    "vllm_importance_sampling_cap": _IS, "off_policy_mask_threshold": _IS,
    "use_bias_correction_kl": "asyncrl's KL estimators are actor.kl_loss_type's",
    "use_transformers_continuous_batching": _ENGINE,
    "transformers_continuous_batching_config": _ENGINE, "use_transformers_paged": _ENGINE,
    "lora_dropout": "asyncrl's LoRA adapters have no dropout",
}
"""Fields refused when given a value other than TRL's default, with the reason."""
