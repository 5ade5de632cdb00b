"""asyncrl: decoupled (one-step-off and fully asynchronous) RL post-training for LLMs.

Importing it checks the installed torch against `MIN_TORCH` (without importing torch), so an
environment with an older torch fails here with one line instead of deep inside the engine.
"""

import re
from importlib import metadata

__version__ = "0.1.0"

MIN_TORCH = (2, 4)
"""The oldest torch asyncrl runs on (pyproject's `torch>=` bound, a test keeps them equal): the
rollout engine's forward calls `torch.nn.functional.rms_norm`, new in 2.4. The rest is older:
`scaled_dot_product_attention(scale=)` 2.1, `torch.load(weights_only=)` 1.13."""


def check_torch(version: str) -> None:
    """Raise ImportError naming the fix if torch `version` ("2.13.0+cu128") is below MIN_TORCH."""
    found = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if found < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"asyncrl needs torch>={need}, found torch {version}: pip install 'torch>={need}' "
                          "(a CUDA build from https://pytorch.org keeps your GPUs)")


try:
    check_torch(metadata.version("torch"))
except metadata.PackageNotFoundError:  # no torch at all: the first `import torch` says so
    pass



_API = {"Trainer": "asyncrl.api", "GRPOTrainer": "asyncrl.api", "GRPOConfig": "asyncrl.config.trl_map"}
"""TRL's names (and the keyword `Trainer`), imported when first used so `import asyncrl` stays light."""


def __getattr__(name: str) -> object:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")
