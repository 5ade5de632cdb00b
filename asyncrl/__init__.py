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


def version_tuple(version: str, parts: int = 2) -> tuple[int, ...]:
    """The first `parts` numbers of a version string, to compare as a tuple (strings compare
    "2.11" < "2.5"). The one place asyncrl reads a version; compare with `torch_at_least`.

    Example: "2.11.0+cu130" -> (2, 11); "2.4.0a0+git1234" -> (2, 4); "10.0", 3 -> (10, 0)."""
    return tuple(int(p) for p in re.findall(r"\d+", version)[:parts])


def torch_at_least(*need: int) -> bool:
    """Whether the installed torch is at least `need` (`torch_at_least(2, 5)`), compared as tuples."""
    import torch

    return version_tuple(torch.__version__, len(need)) >= need


def check_torch(version: str) -> None:
    """Raise ImportError naming the fix if torch `version` ("2.13.0+cu128") is below MIN_TORCH."""
    found = version_tuple(version)
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
