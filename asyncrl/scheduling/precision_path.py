"""Which mixed-precision path the trainer takes, decided once per run from `model.dtype`,
`model.mixed_precision` and the trainer's device. Pure (no torch); shared by the run plan (its
start line and memory model) and the trainer's workers, which resolve it the same way.

The paths (`asyncrl.training.precision` runs them):
- "float32": `model.dtype=float32`, no mixed precision.
- "param_dtype": FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: parameters
  and activations in bf16 in the forward and the backward, float32 master weights and optimizer
  state, gradients accumulated (and, sharded, reduced) in float32.
- "autocast": float32 parameters, forwards under `torch.autocast` (matmuls in bf16, the residual
  stream and the weights' gradients float32).

Not here: running them, or how the device's memory is sized (`scheduling.micro_budget` takes the
path as an input).
"""

from __future__ import annotations

from typing import Literal

PrecisionPath = Literal["float32", "param_dtype", "autocast"]


def precision_path(mode: str, dtype: str, device: str) -> PrecisionPath:
    """The path of `model.mixed_precision=mode` for `model.dtype=dtype` on `device`. `auto` is
    "param_dtype" on CUDA (FSDP2's policy, what verl and torchtitan train with) and "autocast"
    elsewhere: on the 2-core CPU the two measured within the machine's noise (docs/training.md,
    "Mixed precision"), so CPU runs stay as they were.

    Example: ("auto", "bfloat16", "cuda") -> "param_dtype"; ("auto", "bfloat16", "cpu") ->
    "autocast"; ("param_dtype", "bfloat16", "cpu") -> "param_dtype"; (any, "float32", any) ->
    "float32"."""
    assert mode in ("auto", "param_dtype", "autocast"), mode
    if dtype == "float32":
        return "float32"
    if mode == "auto":
        return "param_dtype" if device == "cuda" else "autocast"
    return "param_dtype" if mode == "param_dtype" else "autocast"


def describe(path: PrecisionPath) -> str:
    """One phrase for the start line and the bench: `param_dtype (bf16 parameters, ...)`."""
    return {"float32": "float32",
            "param_dtype": "param_dtype (bf16 parameters and activations, float32 masters and gradients)",
            "autocast": "autocast (float32 parameters, bf16 matmuls)"}[path]
