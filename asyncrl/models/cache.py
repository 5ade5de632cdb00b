"""Where the built-in models are cached on this machine: one answer for the loader, the tiny
model's builder and preflight.

Not here: what is cached (`tiny`, `loading`), or the Hugging Face hub cache (`loading.hf_hub_cache`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where built-in models are cached: $ASYNCRL_CACHE, else $XDG_CACHE_HOME/asyncrl (read at
    call time, so a test or a run can point it elsewhere)."""
    root = os.environ.get("ASYNCRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "asyncrl")
    return Path(root)
