"""Where the built-in models are cached on this machine: one answer for the loader, the tiny
models' builders and preflight; and how a built model lands there (`load_or_build`).

Not here: what is cached (`tiny`, `tiny_tools`, `loading`), or the Hugging Face hub cache
(`loading.hf_hub_cache`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def cache_dir() -> Path:
    """Where built-in models are cached: $ASYNCRL_CACHE, else $XDG_CACHE_HOME/asyncrl (read at
    call time, so a test or a run can point it elsewhere)."""
    root = os.environ.get("ASYNCRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "asyncrl")
    return Path(root)


def load_or_build(path: Path, build: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]],
                  rebuild: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer cached at `path`, else `build()`'s (model, tokenizer, warm-up report),
    saved there with the report (warmup.json): written beside `path` and renamed into place, so a
    reader never sees half a model. The model comes back in eval mode."""
    if (path / "config.json").exists() and not rebuild:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model, tok, report = build()
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "warmup.json").write_text(json.dumps(report))
    shutil.rmtree(path, ignore_errors=True)
    tmp.replace(path)
    model.eval()
    return model, tok
