"""TRL's `GRPOConfig` for asyncrl: the fields a script gives become asyncrl's keys with TRL's semantics.

    from asyncrl import GRPOConfig, GRPOTrainer
    args = GRPOConfig(output_dir="runs/grpo", per_device_train_batch_size=16, gradient_accumulation_steps=4,
                      num_generations=8, loss_type="dr_grpo", report_to="none")

`grpo_settings(given, world)` applies `trl_fields`' rule to the fields given: a mapped field sets its
keys (even at TRL's default: `report_to="none"` means no integrations), a kept one is bookkeeping,
any other field is accepted at TRL's default and refused otherwise; all refusals come together.

TRL's batch arithmetic (its `GRPOConfig.__post_init__`), counted in completions: a generation batch
is `per_device_train_batch_size x world x steps_per_generation` (or `generation_batch_size`), an
optimizer step `per_device_train_batch_size x world x gradient_accumulation_steps`. asyncrl counts
prompts: `data.train_batch_size` = generation batch / num_generations, `actor.ppo_mini_batch_size` =
optimizer batch / num_generations. `world` is TRL's world size: `WORLD_SIZE` as accelerate and
torchrun set it, else 1. `max_steps` and `num_train_epochs` count TRL's optimizer steps and passes
over the data; `step_count` turns them into asyncrl's steps (one generation batch each) once the
batch sizes are resolved.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from asyncrl.config.trl_fields import DEFAULTS, MAPPED, REFUSED
from asyncrl.errors import ConfigError, ConfigErrors

SIMPLE = {
    "output_dir": "trainer.output_dir", "learning_rate": "actor.lr", "weight_decay": "actor.weight_decay",
    "max_grad_norm": "actor.grad_clip", "num_generations": "rollout.n", "num_generations_eval": "rollout.val_n",
    "max_completion_length": "data.max_response_length", "max_prompt_length": "data.max_prompt_length",
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "num_iterations": "actor.ppo_epochs",
    "seed": "seed", "shuffle_dataset": "data.shuffle", "entropy_coef": "actor.entropy_coeff",
    "run_name": "trainer.experiment_name", "project": "trainer.project_name",
    "save_total_limit": "trainer.max_ckpt_to_keep", "eval_on_start": "trainer.val_before_train",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "rollout.tensor_model_parallel_size", "reward_weights": "reward.function_weights",
    "gradient_checkpointing": "model.enable_gradient_checkpointing",
    "activation_checkpointing": "model.enable_gradient_checkpointing", "torch_compile": "actor.use_torch_compile",
    "lora_alpha": "model.lora_alpha", "lora_r": "model.lora_rank",
    "num_completions_to_print": "trainer.log_generations",
}
"""Fields that mean exactly one asyncrl key (None: left to asyncrl)."""

LOSS_TYPES = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
              "dr_grpo": "seq-mean-token-sum-norm", "luspo": "seq-mean-token-sum", "cispo": "token-mean"}
"""TRL's loss_type -> actor.loss_agg_mode (TRL's `_compute_loss` aggregation); cispo is also
actor.policy_loss=cispo; sapo and vespo have no equivalent."""
SCHEDULES = {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"}
INTEGRATIONS = ("tensorboard", "wandb", "mlflow", "swanlab")
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                "steps_per_generation")


class GRPOConfig:
    """TRL's `GRPOConfig(...)`: keyword arguments with its names, read back as attributes (TRL's
    default where not given). Unknown names are refused at once; the rest when the trainer is built."""

    def __init__(self, **fields: Any) -> None:
        unknown = [name for name in fields if name not in DEFAULTS]
        if unknown:
            raise ConfigError("; ".join(unknown_line(n) for n in unknown))
        self.given: dict[str, Any] = dict(fields)

    def __getattr__(self, name: str) -> Any:
        if name in DEFAULTS:
            return self.__dict__.get("given", {}).get(name, DEFAULTS[name])
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self.given.items())})"


def unknown_line(name: str) -> str:
    close = difflib.get_close_matches(name, list(DEFAULTS), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"GRPOConfig({name}=...): not a TRL GRPOConfig field; {hint}asyncrl's own keys go in "
            f"config={{'actor.lr': ...}} with asyncrl's or verl's dotted names")


def world_size() -> int:
    """TRL's world size as a launcher sets it (`WORLD_SIZE`), else 1."""
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def grpo_settings(given: Mapping[str, Any], world: int) -> tuple[dict[str, Any], list[str]]:
    """asyncrl's settings for the GRPOConfig fields `given`, and the notes to print once.
    Raises ConfigError with one line per refused field."""
    refusals: list[str] = []
    settings: dict[str, Any] = {}
    notes: list[str] = []
    for name, value in given.items():
        why = None
        if name not in DEFAULTS:
            refusals.append(unknown_line(name))
        elif name in REFUSED and value != DEFAULTS[name]:
            why = REFUSED[name]
        elif name in SIMPLE and value is not None:
            settings[SIMPLE[name]] = value
        elif name in MAPPED and name not in SIMPLE:
            why = _special(name, value, given, settings, notes)
        if why:
            refusals.append(f"GRPOConfig({name}={value!r}): {why}")
    if any(n in given and given[n] != DEFAULTS[n] for n in BATCH_FIELDS):
        refusals += _batch(given, world, settings)
    if given.get("push_to_hub"):
        notes.append("GRPOConfig(push_to_hub=True): asyncrl uploads nothing; the checkpoints are HF folders under "
                     "the run directory's checkpoints/ (huggingface-cli upload)")
    if refusals:
        raise ConfigErrors(refusals)
    return settings, notes


def _get(given: Mapping[str, Any], name: str) -> Any:
    return given.get(name, DEFAULTS[name])


def _special(name: str, value: Any, given: Mapping[str, Any], settings: dict[str, Any],
             notes: list[str]) -> str | None:
    """Set the keys of a field that is not one key; return why it is refused, or None."""
    if name in ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                "steps_per_generation", "max_steps", "num_train_epochs", "eval_steps", "save_steps",
                "lora_target_modules", "adam_beta2"):
        return _later(name, value, given, settings)
    if name == "lr_scheduler_type":
        if value not in SCHEDULES and value != DEFAULTS[name]:
            return "asyncrl's schedules are constant and cosine (actor.lr_scheduler)"
        if value in SCHEDULES:
            settings["actor.lr_scheduler"] = SCHEDULES[value]
    elif name in ("warmup_steps", "warmup_ratio"):
        ratio = name == "warmup_ratio" or 0 < value < 1
        settings.update({"actor.warmup_steps": -1, "actor.warmup_ratio": value} if ratio else
                        {"actor.warmup_steps": int(value)})
    elif name == "optim":
        if value not in ("adamw_torch", "adamw_torch_fused"):
            return "asyncrl trains with AdamW (adamw_torch, adamw_torch_fused)"
    elif name == "adam_beta1":
        settings["actor.betas"] = [value, _get(given, "adam_beta2")]
    elif name == "bf16":
        if value is False:
            settings["model.dtype"] = "float32"
    elif name == "report_to":
        return _report_to(value, settings)
    elif name in ("eval_strategy", "save_strategy"):
        return _cadence(name, value, given, settings)
    elif name == "use_cpu":
        if value:
            settings["trainer.device"] = "cpu"
    elif name == "train_sampling_strategy":
        if value not in ("random", "sequential"):
            return "asyncrl reads the data shuffled (random) or in order (sequential) only"
        settings["data.shuffle"] = value == "random"
    elif name == "model_init_kwargs":
        return _init_kwargs(value, settings)
    elif name == "top_k":
        settings["rollout.top_k"] = -1 if not value else value
    elif name == "chat_template_kwargs":
        settings["data.chat_template_kwargs"] = [f"{k}={json.dumps(v)}" for k, v in (value or {}).items()]
    elif name in ("use_vllm", "vllm_mode"):
        if value and value != DEFAULTS[name] and not any("own engine" in n for n in notes):
            notes.append(f"GRPOConfig({name}={value!r}): asyncrl generates with its own engine; "
                         f"pipeline=one_step_off or fully_async puts it on devices of its own")
    else:
        return _algorithm(name, value, given, settings)
    return None


def _later(name: str, value: Any, given: Mapping[str, Any], settings: dict[str, Any]) -> str | None:
    """Fields read together with others (batch sizes, step counts, LoRA, cadences)."""
    if name == "adam_beta2" and "adam_beta1" not in given:
        settings["actor.betas"] = [DEFAULTS["adam_beta1"], value]
    elif name == "lora_target_modules" and value is not None:
        settings["model.target_modules"] = [value] if isinstance(value, str) else list(value)
    elif name == "save_steps":
        if not isinstance(value, int) or value < 1:
            return "asyncrl saves every N steps (trainer.save_freq): give a whole number of steps"
        if _get(given, "save_strategy") == "steps":
            settings["trainer.save_freq"] = value
    elif name == "eval_steps" and value is not None and (not isinstance(value, int) or value < 1):
        return "asyncrl validates every N steps (trainer.test_freq): give a whole number of steps"
    return None


def _algorithm(name: str, value: Any, given: Mapping[str, Any], settings: dict[str, Any]) -> str | None:
    if name == "beta":
        settings.update({"actor.use_kl_loss": value > 0, "actor.kl_loss_coef": value, "actor.kl_loss_type": "k3"})
    elif name == "epsilon":
        settings["actor.clip_ratio_low"] = value
        if _get(given, "epsilon_high") is None:  # TRL: epsilon_high defaults to epsilon
            settings["actor.clip_ratio_high"] = value
    elif name == "epsilon_high":
        if value is not None:
            settings["actor.clip_ratio_high"] = value
    elif name == "loss_type":
        if value not in LOSS_TYPES:
            return "no asyncrl equivalent (dapo, bnpo, grpo, dr_grpo, luspo and cispo map)"
        settings["actor.loss_agg_mode"] = LOSS_TYPES[value]
        if value == "cispo":
            if _get(given, "importance_sampling_level") == "sequence":
                return "asyncrl's cispo weighs tokens; importance_sampling_level='sequence' is gspo's"
            settings["actor.policy_loss"] = "cispo"
    elif name == "scale_rewards":
        if value not in ("group", "none", True, False):
            return "asyncrl scales advantages per group or not at all (algorithm.norm_adv_by_std_in_grpo)"
        settings["algorithm.norm_adv_by_std_in_grpo"] = value in ("group", True)
    elif name == "importance_sampling_level":
        if value not in ("token", "sequence"):
            return "asyncrl's ratios are per token (actor.policy_loss=vanilla) or per sequence (gspo)"
        if value == "sequence":
            settings["actor.policy_loss"] = "gspo"
    elif name == "use_peft":
        if value:
            settings.setdefault("model.lora_rank", _get(given, "lora_r"))
            settings.setdefault("model.lora_alpha", _get(given, "lora_alpha"))
    return None


def _report_to(value: Any, settings: dict[str, Any]) -> str | None:
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n for n in names if n not in ("none", "console", "jsonl")]  # asyncrl's two are always on
    if "all" in names:
        names = ["tensorboard"]
    other = [n for n in names if n not in INTEGRATIONS]
    if other:
        return f"asyncrl reports to {', '.join(INTEGRATIONS)} (trainer.logger), not {', '.join(other)}"
    settings["trainer.logger"] = ["console", "jsonl", *dict.fromkeys(names)]
    return None


def _cadence(name: str, value: Any, given: Mapping[str, Any], settings: dict[str, Any]) -> str | None:
    key = "trainer.test_freq" if name == "eval_strategy" else "trainer.save_freq"
    if value == "no":
        settings[key] = 0
    elif value == "steps":
        steps = _get(given, "save_steps") if name == "save_strategy" else (
            _get(given, "eval_steps") or _get(given, "logging_steps"))
        if isinstance(steps, int) and steps >= 1:
            settings[key] = steps
    else:
        return f"asyncrl's cadence is every N steps ({key}): give 'steps' or 'no'"
    return None


def _init_kwargs(value: Any, settings: dict[str, Any]) -> str | None:
    kwargs = dict(value or {})
    dtype = str(kwargs.pop("dtype", kwargs.pop("torch_dtype", ""))).removeprefix("torch.")
    if dtype in ("float32", "bfloat16"):
        settings["model.dtype"] = dtype
    elif dtype not in ("", "auto"):
        kwargs["dtype"] = dtype
    kwargs.pop("attn_implementation", None)  # asyncrl picks its attention kernels (model.packed_attention)
    return f"asyncrl loads the model itself; {', '.join(kwargs)} has no counterpart" if kwargs else None


def _batch(given: Mapping[str, Any], world: int, settings: dict[str, Any]) -> list[str]:
    """TRL's batch arithmetic (see the module docstring); the refusals it leads to."""
    per_device, accumulation = _get(given, "per_device_train_batch_size"), _get(given, "gradient_accumulation_steps")
    generations = _get(given, "num_generations")
    gen_batch, steps_per_gen = _get(given, "generation_batch_size"), _get(given, "steps_per_generation")
    global_batch = per_device * world
    if gen_batch is not None and steps_per_gen is not None:
        return ["GRPOConfig: generation_batch_size and steps_per_generation cannot both be set (TRL's rule)"]
    if gen_batch is not None and gen_batch % global_batch:
        return [f"GRPOConfig(generation_batch_size={gen_batch}): must be divisible by per_device_train_batch_size x "
                f"world size ({per_device} x {world})"]
    gen_batch = gen_batch if gen_batch is not None else global_batch * (steps_per_gen or accumulation)
    step_batch = global_batch * accumulation
    where = f"(per_device_train_batch_size {per_device} x world size {world}"
    if gen_batch % generations:
        return [f"GRPOConfig: the generation batch {where} x steps per generation = {gen_batch}) must be divisible "
                f"by num_generations ({generations})"]
    if step_batch % generations:
        return [f"GRPOConfig: an optimizer step {where} x gradient_accumulation_steps {accumulation} = "
                f"{step_batch} completions) must hold whole groups of num_generations ({generations}) in asyncrl"]
    if gen_batch % step_batch:
        return [f"GRPOConfig: the generation batch ({gen_batch}) must be a whole number of optimizer steps "
                f"({step_batch} completions) in asyncrl: raise steps_per_generation or generation_batch_size"]
    settings["data.train_batch_size"] = gen_batch // generations
    settings["actor.ppo_mini_batch_size"] = step_batch // generations
    return []


def step_count(given: Mapping[str, Any], batch: int, mini_batch: int, epochs: int, rows: int | None) -> int | None:
    """asyncrl's trainer.total_training_steps for TRL's max_steps (optimizer steps) or, without it,
    num_train_epochs (passes over `rows` prompts); None when neither was given."""
    updates_per_step = epochs * max(batch // mini_batch, 1)
    if _get(given, "max_steps") > 0:
        return max(math.ceil(given["max_steps"] / updates_per_step), 1)
    if "num_train_epochs" in given and rows:
        return max(math.ceil(given["num_train_epochs"] * rows / batch), 1)
    return None
