"""Which mixed-precision path the trainer takes, decided once per run from `model.dtype` and
`model.mixed_precision`. Pure (no torch); shared by the run plan (its start line and memory
model) and the trainer's workers, which resolve it the same way.

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


def precision_path(mode: str, dtype: str) -> PrecisionPath:
    """The path of `model.mixed_precision=mode` for `model.dtype=dtype`. `auto` is "param_dtype"
    on every device: on CUDA it is FSDP2's policy, what verl and torchtitan train with; on the
    2-core CPU it measured no slower than autocast (0.91x its CPU time per step on the trainer
    bench's CPU workload, docs/training.md "Mixed precision").

    Example: ("auto", "bfloat16") -> "param_dtype"; ("autocast", "bfloat16") -> "autocast";
    (any, "float32") -> "float32"."""
    assert mode in ("auto", "param_dtype", "autocast"), mode
    if dtype == "float32":
        return "float32"
    return "autocast" if mode == "autocast" else "param_dtype"


def describe(path: PrecisionPath) -> str:
    """One phrase for the start line and the bench: `param_dtype (bf16 parameters, ...)`."""
    return {"float32": "float32",
            "param_dtype": "param_dtype (bf16 parameters and activations, float32 masters and gradients)",
            "autocast": "autocast (float32 parameters, bf16 matmuls)"}[path]
