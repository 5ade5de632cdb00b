"""Triton kernels of the rollout engine's decode step: `elementwise` (residual add + RMSNorm,
q/k norm + rotary + K/V cache write, SiLU-multiply: the fused decode step) and
`decode_attention` (split-KV attention over each row's real length).

On a GPU they compile for the device; on the CPU Triton only runs interpreted
(TRITON_INTERPRET=1, read when a kernel module is imported, so this package imports none of
them): that is how the tests check them, and too slow for a CPU engine. This module only says
whether the fused decode step runs (`rollout.fused_decode`).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from asyncrl.config.names import FusedDecode
from asyncrl.errors import ConfigError


def interpreting() -> bool:
    """Whether Triton kernels imported now run in Triton's interpreter (over CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def use_fused_decode(choice: FusedDecode, device: torch.device) -> bool:
    """`rollout.fused_decode` resolved on `device`.

    auto: on CUDA (a decode step there is launch-bound: the fused step launches ~10 kernels per
    layer instead of ~45), off on the CPU (interpreted Triton is ~100x slower than eager torch,
    and the eager step is bound by its matmuls, not by launches). on: a `ConfigError` where Triton
    cannot run (not installed; on the CPU without TRITON_INTERPRET=1, which only tests set)."""
    assert choice in ("auto", "on", "off"), choice
    if choice == "off":
        return False
    triton_present = importlib.util.find_spec("triton") is not None
    runs = triton_present and (device.type == "cuda" or interpreting())
    if choice == "auto":
        return runs and device.type == "cuda"
    if not runs:
        why = "triton is not installed" if not triton_present else "Triton runs on the CPU only interpreted"
        raise ConfigError(f"rollout.fused_decode=on on {device.type}: {why} (TRITON_INTERPRET=1, tests only); "
                          "set rollout.fused_decode=auto")
    return True
