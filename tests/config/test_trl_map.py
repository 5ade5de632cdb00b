"""TRL's GRPOConfig fields become asyncrl's keys with TRL's semantics; refusals come together."""

from __future__ import annotations

import pytest

from asyncrl.config.trl_fields import DEFAULTS, KEPT
from asyncrl.config.trl_map import GRPOConfig, grpo_settings, step_count
from asyncrl.errors import ConfigError


def test_trls_batch_arithmetic_counts_completions_with_the_world_size() -> None:
    given = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "num_generations": 8}
    settings, _ = grpo_settings(given, world=2)  # 2 x 16 x 4 = 128 completions = 16 prompts per step
    assert (settings["data.train_batch_size"], settings["actor.ppo_mini_batch_size"]) == (16, 16)
    settings, _ = grpo_settings({**given, "steps_per_generation": 8}, world=2)  # 256 generated, 2 updates
    assert (settings["data.train_batch_size"], settings["actor.ppo_mini_batch_size"]) == (32, 16)
    settings, _ = grpo_settings({"per_device_train_batch_size": 4, "generation_batch_size": 32,
                                 "num_generations": 4}, world=1)
    assert (settings["data.train_batch_size"], settings["actor.ppo_mini_batch_size"]) == (8, 1)
    with pytest.raises(ConfigError, match=r"must be divisible by num_generations \(8\)"):
        grpo_settings({"per_device_train_batch_size": 4}, world=1)  # TRL's own rule
    with pytest.raises(ConfigError, match=r"must hold whole groups of num_generations \(8\)"):
        grpo_settings({"per_device_train_batch_size": 4, "steps_per_generation": 2}, world=1)
    with pytest.raises(ConfigError, match="cannot both be set"):
        grpo_settings({"generation_batch_size": 16, "steps_per_generation": 2}, world=1)


def test_max_steps_and_epochs_count_trls_optimizer_steps_and_passes() -> None:
    assert step_count({"max_steps": 12}, batch=32, mini_batch=16, epochs=2, rows=None) == 3  # 4 updates a step
    assert step_count({"num_train_epochs": 2.0}, batch=8, mini_batch=8, epochs=1, rows=100) == 25
    assert step_count({}, batch=8, mini_batch=8, epochs=1, rows=100) is None  # asyncrl's own count


def test_the_algorithm_names_map_with_trls_meaning() -> None:
    settings, _ = grpo_settings({"loss_type": "dr_grpo", "scale_rewards": "none", "importance_sampling_level":
                                 "sequence", "epsilon": 0.3, "adam_beta1": 0.8, "adam_beta2": 0.95, "beta": 0.04,
                                 "top_k": 0, "warmup_steps": 0.1, "use_peft": True}, world=1)
    assert settings["actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert settings["algorithm.norm_adv_by_std_in_grpo"] is False and settings["actor.policy_loss"] == "gspo"
    assert settings["actor.clip_ratio_low"] == settings["actor.clip_ratio_high"] == 0.3  # TRL: high = low
    assert settings["actor.betas"] == [0.8, 0.95] and settings["rollout.top_k"] == -1
    assert (settings["actor.warmup_steps"], settings["actor.warmup_ratio"]) == (-1, 0.1)
    assert (settings["actor.kl_loss_coef"], settings["actor.kl_loss_type"]) == (0.04, "k3")
    assert (settings["model.lora_rank"], settings["model.lora_alpha"]) == (16, 32)  # TRL's LoRA defaults
    for order in (["importance_sampling_level", "loss_type"], ["loss_type", "importance_sampling_level"]):
        both = {"importance_sampling_level": "sequence", "loss_type": "luspo"}
        settings, _ = grpo_settings({k: both[k] for k in order}, world=1)  # the order given does not matter
        assert (settings["actor.policy_loss"], settings["actor.loss_agg_mode"]) == ("gspo", "seq-mean-token-sum")
    assert grpo_settings({"loss_type": "cispo"}, world=1)[0]["actor.policy_loss"] == "cispo"


def test_report_to_adds_integrations_and_keeps_console_and_jsonl() -> None:
    assert grpo_settings({"report_to": ["tensorboard"]}, 1)[0]["trainer.logger"] == ["console", "jsonl", "tensorboard"]
    assert grpo_settings({"report_to": "none"}, 1)[0]["trainer.logger"] == ["console", "jsonl"]
    assert grpo_settings({"report_to": "all"}, 1)[0]["trainer.logger"] == ["console", "jsonl", "tensorboard"]
    with pytest.raises(ConfigError, match=r"report_to='comet_ml'.*not comet_ml"):
        grpo_settings({"report_to": "comet_ml"}, 1)


def test_defaults_are_accepted_bookkeeping_kept_and_refusals_reported_together() -> None:
    assert grpo_settings(dict(DEFAULTS), world=1)[0]["rollout.n"] == 8  # every field at TRL's default
    kept = {"logging_steps": 5, "run_name": "x", "push_to_hub": True, "save_strategy": "no", "bf16": True}
    settings, notes = grpo_settings(kept, world=1)
    assert settings == {"trainer.experiment_name": "x", "trainer.save_freq": 0} and "uploads nothing" in notes[0]
    assert "logging_steps" in KEPT
    settings, notes = grpo_settings({"use_vllm": True, "vllm_mode": "server"}, world=1)
    assert settings == {} and len(notes) == 1 and "its own engine" in notes[0]
    with pytest.raises(ConfigError) as err:
        grpo_settings({"fp16": True, "loss_type": "sapo", "sync_ref_model": True, "adam_beta1": 0.8}, world=1)
    lines = str(err.value).splitlines()
    assert [line.split(")")[0] for line in lines] == ["GRPOConfig(fp16=True", "GRPOConfig(loss_type='sapo'",
                                                       "GRPOConfig(sync_ref_model=True"]
    with pytest.raises(ConfigError, match=r"GRPOConfig\(num_generation=...\).*did you mean num_generations\?"):
        GRPOConfig(num_generation=4)
    assert GRPOConfig(learning_rate=1e-5).learning_rate == 1e-5 and GRPOConfig().num_generations == 8
