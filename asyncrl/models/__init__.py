"""Models and tokenizers from offline sources only (see `loading`, `tiny`, `tiny_tools` and `tiny_task`).

The names below load on first use, so importing `asyncrl.models.weights` (weight sync) or the
simulator does not import transformers.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"load_model": "loading", "SMOLLM2": "loading", "TinySpec": "tiny", "load_tiny": "tiny",
         "TinyToolsSpec": "tiny_tools", "load_tiny_tools": "tiny_tools", "TaskModelSpec": "task_models",
         "TASK_MODELS": "task_models", "load_task_model": "tiny_task"}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'asyncrl.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"asyncrl.models.{_LAZY[name]}"), name)
