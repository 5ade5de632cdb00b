"""Every field of the installed TRL `GRPOConfig` is classified, with TRL's own default (trl is a test
dependency: without it this fails, so a new TRL field cannot go unclassified)."""

from __future__ import annotations

import dataclasses

from asyncrl.config.trl_fields import DEFAULTS, KEPT, MAPPED, REFUSED


def installed_fields() -> dict[str, object]:
    from trl import GRPOConfig  # the test extra pins trl: an ImportError here is a failure, not a skip

    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            for f in dataclasses.fields(GRPOConfig) if f.init}


def test_every_installed_grpo_config_field_has_trls_default_and_one_class() -> None:
    fields = installed_fields()
    assert len(fields) > 150  # GRPOConfig's own and TrainingArguments'
    assert {n: d for n, d in fields.items() if n not in DEFAULTS} == {}  # a new TRL field: classify it
    assert {n: (d, DEFAULTS[n]) for n, d in fields.items() if DEFAULTS[n] != d} == {}
    classes = [set(MAPPED), set(KEPT), set(REFUSED)]
    assert set(DEFAULTS) == set.union(*classes) and sum(map(len, classes)) == len(DEFAULTS)


def test_what_the_migration_guide_maps_is_mapped_not_refused() -> None:
    documented = ["learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
                  "max_grad_norm", "num_generations", "generation_batch_size", "steps_per_generation",
                  "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
                  "max_prompt_length", "temperature", "top_p", "top_k", "beta", "epsilon", "epsilon_high",
                  "loss_type", "scale_rewards", "importance_sampling_level", "num_iterations", "max_steps",
                  "num_train_epochs", "gradient_checkpointing", "use_peft", "lora_r", "lora_alpha",
                  "lora_target_modules", "report_to", "output_dir", "save_steps", "use_vllm", "vllm_mode"]
    assert [n for n in documented if n not in MAPPED] == []
