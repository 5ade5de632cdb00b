"""LoRA through peft: wrap the actor's model, export merged weights, save and load adapters.

`apply_lora(model, rank, alpha, target_modules)` injects peft LoRA layers into `model` (in
place; the returned `PeftModel` wraps it) and freezes everything but the adapters. The rollout
engines never see adapters: `merged_named` gives every parameter under its original name, the
LoRA-targeted weights as W + scale x B @ A (what peft's `merge_and_unload` would hold), so weight
sync and the engine stay unchanged.

A checkpoint's actor directory holds the merged model in HF format (`from_pretrained` loads it
as a plain model) and the adapters in `lora_adapter/` (peft `save_pretrained`: adapter_config.json
and adapter_model.safetensors; `PeftModel.from_pretrained(base, dir)` loads them). They are in a
sub-directory because transformers' `from_pretrained` treats a directory holding
adapter_config.json as an adapter and goes looking for its base model. Resuming loads the
adapters only: the base weights are the model the run starts from.

Not here: the optimizer (it takes the trainable parameters, i.e. the adapters) or the reference
model (the factory builds it from the base model before wrapping).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

from asyncrl.errors import ConfigError

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_DIR = "lora_adapter"
_ADAPTER = "default"  # peft's name for the one adapter we train


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ConfigError("model.lora_rank > 0 needs peft: pip install 'asyncrl[peft]' "
                          "(or set model.lora_rank=0)") from exc
    return peft


def apply_lora(model: nn.Module, rank: int, alpha: int, target_modules: tuple[str, ...]) -> PeftModel:
    """`model` with LoRA adapters of rank `rank` on `target_modules` ("all-linear": every linear
    layer but the output head); only the adapters require gradients."""
    peft = _peft()
    targets: str | list[str] = "all-linear" if target_modules == ("all-linear",) else list(target_modules)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    with warnings.catch_warnings():  # peft asks transformers a deprecated question
        warnings.simplefilter("ignore", FutureWarning)
        wrapped: PeftModel = peft.get_peft_model(model, config)
    return wrapped


def is_lora(model: nn.Module) -> TypeGuard[PeftModel]:
    return hasattr(model, "peft_config")


def _lora_layers(base: nn.Module) -> dict[str, Any]:
    """LoRA layers by the name of the frozen weight they wrap (`....q_proj.base_layer.weight`)."""
    lora_layer = _peft().tuners.lora.LoraLayer
    return {f"{name}.base_layer.weight": m for name, m in base.named_modules() if isinstance(m, lora_layer)}


@torch.no_grad()
def merged_named(model: PeftModel) -> dict[str, torch.Tensor]:
    """Every base parameter under its original name; LoRA-targeted weights merged (W + s B A).

    Non-targeted tensors are detached views (no copy), as `export_named` gives them."""
    base = model.get_base_model()
    layers = _lora_layers(base)
    out: dict[str, torch.Tensor] = {}
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        weight = param.detach()
        layer = layers.get(name)
        if layer is not None:
            weight = weight + layer.get_delta_weight(_ADAPTER).to(weight.dtype)
        out[name.replace(".base_layer.", ".")] = weight
    return out


def save_lora(model: PeftModel, path: Path) -> None:
    """The merged model in HF format under `path`, the adapters under `path / ADAPTER_DIR`."""
    path.mkdir(parents=True, exist_ok=True)
    base: Any = model.get_base_model()
    base.save_pretrained(path, state_dict=merged_named(model))
    model.save_pretrained(str(path / ADAPTER_DIR))


def load_lora(model: PeftModel, path: Path) -> None:
    """The adapters saved by `save_lora` into `model` (whose base is the run's starting model)."""
    from safetensors.torch import load_file

    state = load_file(str(path / ADAPTER_DIR / "adapter_model.safetensors"))
    result = _peft().set_peft_model_state_dict(model, state)
    assert not result.unexpected_keys, f"adapter tensors the model has no place for: {result.unexpected_keys[:3]}"
