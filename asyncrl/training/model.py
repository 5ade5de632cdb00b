"""The model a trainer trains, from the one it loaded and its `model.*` section: gradient
checkpointing (`asyncrl.training.memory`), then LoRA (`asyncrl.training.lora`).

Every trainer construction goes through `prepare_actor_model`, so the CPU trainer and a GPU
trainer read `model.enable_gradient_checkpointing` and `model.lora_*` the same way. Build the
reference model and the critic from the model *before* this call: they need the base model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.config.schema import ModelConfig
from asyncrl.training.lora import apply_lora
from asyncrl.training.memory import enable_gradient_checkpointing

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


def prepare_actor_model(model: PreTrainedModel, cfg: ModelConfig) -> PreTrainedModel | PeftModel:
    """`model` (changed in place) with checkpointing on if asked, wrapped in LoRA adapters when
    `cfg.lora_rank > 0` (then only the adapters train)."""
    if cfg.enable_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if cfg.lora_rank > 0:
        return apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.target_modules)
    return model
