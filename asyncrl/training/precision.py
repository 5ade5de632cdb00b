"""Mixed precision as FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` does it,
in one process too; and the autocast path it replaces. Which path runs is decided once
(`asyncrl.scheduling.precision_path`) and held in a `Precision`.

One process, "param_dtype" (`MasterWeights`): the model's parameters are cast to bf16 in place
(buffers, e.g. rotary frequencies, stay float32, as FSDP2 leaves them), so forwards and backwards
run in bf16 with no autocast; a float32 master copy of every parameter is what the optimizer
steps. Each parameter's bf16 gradient is added into its master's float32 gradient as soon as
autograd has it (a post-accumulate-grad hook, which then frees the bf16 one), so micro-batches
accumulate in float32, as FSDP2's fp32 reduce-scatter into fp32 sharded gradients does; after
each optimizer step the stepped masters are copied back into the bf16 parameters (round to
nearest, exactly as `.to(bfloat16)` rounds). `at_masters()` swaps the masters in for the
duration of a block, so saving, loading, LoRA merging and the engines' export read and write
float32 exactly as on the autocast path: checkpoints and exported weights are the same bits.

Several ranks: FSDP2 itself (`fsdp.shard(model, param_dtype)`, under `MixedPrecisionPolicy`): its
sharded float32 parameters are the masters (`OwnWeights`), the policy casts the gathered ones to
bf16 and reduces gradients in float32.

Why not FSDP2 on a one-rank group: the pipelines run one trainer process with no process group;
FSDP2 there would need one (gloo or NCCL, per trainer process), turn every parameter into a
DTensor (every actor method then takes its collective branch, and peft's LoRA layers are not
supported sharded here), and gather and free each layer's parameters in every forward and
backward, copies that one rank does not need. The working copy does the same arithmetic with one
cast per optimizer step.

Not here: which path a run takes, the optimizer's schedule, or sharding itself (`training.fsdp`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from asyncrl.scheduling.precision_path import PrecisionPath, describe, precision_path


def autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """Mixed precision for forwards in `dtype` (off for float32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


@dataclass(frozen=True)
class Precision:
    """A trainer's resolved precision: the path and the compute dtype (`model.dtype`, what the
    engines hold)."""

    path: PrecisionPath
    dtype: torch.dtype

    @classmethod
    def choose(cls, mode: str, dtype: torch.dtype) -> Precision:
        """`model.mixed_precision=mode` for compute dtype `dtype`."""
        return cls(precision_path(mode, _name(dtype)), dtype)

    @property
    def autocast_dtype(self) -> torch.dtype:
        """What forwards autocast to (float32: autocast off)."""
        return self.dtype if self.path == "autocast" else torch.float32

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype parameters run in (FSDP2's `param_dtype`), or None where they stay float32."""
        return self.dtype if self.path == "param_dtype" else None

    def describe(self) -> str:
        return describe(self.path)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def cast_params(model: nn.Module, dtype: torch.dtype) -> None:
    """`model`'s floating-point parameters in `dtype`, in place (the same Parameter objects);
    buffers keep their dtype."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)


class OwnWeights:
    """The model's own parameters are the float32 masters (float32, autocast, and FSDP2's sharded
    parameters): the optimizer steps them, nothing to fold or copy."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def trainable(self) -> list[nn.Parameter]:
        return trainable(self.model)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to do after a step."""

    def at_masters(self, write: bool = False) -> Any:
        return nullcontext()


class MasterWeights:
    """float32 masters of a model whose parameters run in a low-precision dtype (see the module
    docstring). Tied parameters are one Parameter, so one master."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        self.masters = [nn.Parameter(p.detach().float().clone(), requires_grad=p.requires_grad) for p in self.params]
        cast_params(model, dtype)
        self._stepped = [(p, m) for p, m in zip(self.params, self.masters, strict=True) if p.requires_grad]
        for param, master in self._stepped:
            param.register_post_accumulate_grad_hook(_fold_into(master))

    def trainable(self) -> list[nn.Parameter]:
        """What the optimizer steps: the masters of the trainable parameters."""
        return [m for _, m in self._stepped]

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy the masters into the parameters after every step of `optimizer`."""
        optimizer.register_step_post_hook(lambda *_: self.copy_to_params(stepped_only=True))

    @torch.no_grad()
    def copy_to_params(self, stepped_only: bool = False) -> None:
        pairs = self._stepped if stepped_only else list(zip(self.params, self.masters, strict=True))
        if pairs:
            torch._foreach_copy_([p.data for p, _ in pairs], [m.data for _, m in pairs])

    @contextmanager
    def at_masters(self, write: bool = False) -> Iterator[None]:
        """Within the block the parameters hold their float32 masters (the same storage: what is
        loaded into them is loaded into the masters); `write`: copy them back after."""
        working = [p.data for p in self.params]
        for p, m in zip(self.params, self.masters, strict=True):
            p.data = m.data
        try:
            yield
        finally:
            for p, w in zip(self.params, working, strict=True):
                p.data = w
            if write:
                self.copy_to_params()


def _fold_into(master: nn.Parameter) -> Any:
    """A post-accumulate-grad hook adding a parameter's gradient into `master`'s, in float32."""

    def fold(param: torch.Tensor) -> None:
        assert param.grad is not None
        if master.grad is None:
            master.grad = param.grad.to(torch.float32)
        else:
            master.grad.add_(param.grad)
        param.grad = None

    return fold


def weights_for(model: nn.Module, precision: Precision, sharded: bool = False) -> OwnWeights | MasterWeights:
    """Where `model`'s float32 masters live under `precision`: bf16 parameters over `MasterWeights`
    in one process, else the model's own parameters (sharded: FSDP2's policy casts them)."""
    dtype = precision.param_dtype
    return MasterWeights(model, dtype) if dtype is not None and not sharded else OwnWeights(model)
