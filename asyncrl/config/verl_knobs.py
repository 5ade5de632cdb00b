"""The verl keys asyncrl knowingly does not model because they change nothing it trains: engine,
memory, parallelism, logging and profiling knobs (`NOT_MODELLED`), warned about in one line of
their own. A verl key that would change what is trained is not here: `verl.TABLE` maps it, or
names the one value asyncrl has (`always`), which `asyncrl train` enforces.

Data only; `asyncrl.config.verl` reads it.
"""

from __future__ import annotations


def _keys(text: str) -> frozenset[str]:
    """`section: leaf leaf ...` lines -> dotted keys (`section.*` alone: the whole subtree)."""
    keys: set[str] = set()
    for line in text.strip().splitlines():
        section, _, leaves = line.partition(":")
        keys.update([f"{section.strip()}.{leaf}" for leaf in leaves.split()] if leaves else [section.strip()])
    return frozenset(keys)


NOT_MODELLED = _keys("""
actor_rollout_ref.actor: ppo_micro_batch_size shuffle data_loader_seed tau_pos tau_neg freeze_vision_tower
actor_rollout_ref.actor: calculate_entropy use_prefix_grouper use_fused_kernels
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
actor_rollout_ref.model: enable_activation_offload use_liger use_fused_kernels
actor_rollout_ref.model.override_config
actor_rollout_ref.model.fused_kernel_options
actor_rollout_ref.model.tiled_mlp
actor_rollout_ref.model.mtp
actor_rollout_ref.rollout: name prompt_length response_length dtype enforce_eager
actor_rollout_ref.rollout: cudagraph_capture_sizes data_parallel_size expert_parallel_size max_num_batched_tokens
actor_rollout_ref.rollout: pipeline_model_parallel_size max_model_len enable_chunked_prefill enable_prefix_caching
actor_rollout_ref.rollout: logprobs_mode scheduling_policy load_format log_prob_micro_batch_size disable_log_stats
actor_rollout_ref.rollout: multi_stage_wake_up skip_rollout skip_dump_dir skip_tokenizer_init
actor_rollout_ref.rollout: enable_rollout_routing_replay quantization quantization_config_file mtp layered_summon
actor_rollout_ref.rollout.engine_kwargs
actor_rollout_ref.rollout.multi_turn: use_inference_chat_template tokenization_sanity_check_mode
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
data.custom_cls: name
data.sampler: class_name
data.datagen: name
algorithm.pf_ppo
algorithm.filter_groups: metric
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
trainer: default_hdfs_dir del_local_ckpt_after_load max_critic_ckpt_to_keep use_legacy_worker_impl
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
