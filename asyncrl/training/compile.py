"""Regional compilation (`actor.use_torch_compile`): each decoder layer of a model through
`torch.compile`, and what compiling cost, reported apart from the step.

`compile_layers(model, True)` compiles the repeated block, not the whole model (regional
compilation, as torchtitan compiles each TransformerBlock): every decoder layer's `forward` becomes
one compiled function shared by all the layers (they have the same code and shapes, so dynamo
traces and inductor compiles one layer, once per variant: with or without gradients, train or
eval mode), with the packed token count dynamic (`dynamic=True`), so micro-batches of any length
and any number of rows reuse it. What stays eager, and why:
- the packed attention call (`packed_attention.packed_attention`, varlen / jagged / grouped): it is
  disabled for dynamo, a graph break in each layer (its kernel choice and row plans are host
  Python); the parts before and after it (norms, projections, rotary embeddings, SiLU-mul,
  residuals) are compiled. The rows' lengths (host ints) reach it behind `HostLengths`, an object
  dynamo passes through without reading, so a new number of rows is no new guard;
- the embeddings, the final norm and the head (the chunked vocabulary head, `vocab_chunks`, runs
  its own autograd function);
- module hooks: the compiled function is the layer's `forward`, so FSDP2's hooks (`fully_shard`
  runs after this, in the actor: compile before sharding, as torchtitan does) and gradient
  checkpointing's wrapper stay where they are (transformers 5 checkpoints inside `forward`: the
  checkpoint is then traced, as torchtitan compiles checkpointed blocks).
LoRA's adapters (peft, applied before) are inside the layers and compile with them. Parameter
names, state dicts and checkpoints do not change (no wrapper module).

`compile_metrics(model)` reports, per step, what compiling cost since the last report:
`perf/compile_s` (dynamo and inductor wall time, forward frames and the lazily compiled backward;
it is inside the step's `timing_s/*` too, so the step's own time is the difference) and
`perf/recompiles` (frames compiled after the first report: new guards, e.g. a mode or shape not
seen yet). Both are the process's totals (any compiled model in it), from torch's own counters.

Not here: whether a run compiles (`scheduling.plan.RunPlan.torch_compile`: the key unset resolves per
device), compiling the engine's decode step (CUDA graphs do that), or the attention kernels.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch import nn

from asyncrl.training.packed_attention import ROWS

KEY = "actor.use_torch_compile"
RECOMPILE_LIMIT = 64
"""Dynamo's compiled variants per frame (its default: 8), raised for the process when layers are
compiled: the one shared frame holds every compiled model's variants (actor with gradients, actor
and reference without, frozen LoRA bases, the packing check's call), and past the limit dynamo
would run the layers eagerly without a word."""
M = TypeVar("M", bound=nn.Module)


class HostLengths(Sequence[int]):
    """Packed rows' lengths (host ints) as an object dynamo does not look into: a plain tuple
    entering a compiled layer is guarded on its length, so every new number of rows would
    recompile. Only the eager attention call reads it."""

    __slots__ = ("lengths",)

    def __init__(self, lengths: tuple[int, ...]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: Any) -> Any:
        return self.lengths[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.lengths)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: `model.model.layers` (a causal LM; under peft its base model's), a
    decoder's own `layers`, else the first `nn.ModuleList` of blocks."""
    base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
    for owner in (getattr(base, "model", None), base):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, nn.ModuleList):
            return list(layers)
    return next((list(m) for m in base.modules() if isinstance(m, nn.ModuleList) and len(m) > 0), [])


def _layer_forward(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A layer's forward as its class defines it now (FSDP2 swaps in a subclass, whose forward
    transformers wraps again for checkpointing): the layer is an argument, so all layers share
    one compiled frame."""
    return type(layer).forward(layer, *args, **kwargs)


@functools.cache
def _compiled() -> Any:
    return torch.compile(_layer_forward, dynamic=True)


def _call(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    lengths = kwargs.get(ROWS)
    if isinstance(lengths, tuple):
        kwargs[ROWS] = HostLengths(lengths)
    return _compiled()(layer, *args, **kwargs)


def compile_layers(model: M, enabled: bool) -> M:
    """`model` (in place) with each decoder layer's forward compiled when `enabled`; its
    `compile_metrics` start counting here."""
    if not enabled:
        return model
    layers = decoder_layers(model)
    assert layers, f"{KEY}: {type(model).__name__} has no list of decoder layers to compile"
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for layer in layers:
        # an instance attribute: nn.Module.__call__ (hooks, FSDP2's included) calls it as forward
        layer.forward = functools.partial(_call, layer)
    _WATCHES[model] = CompileWatch()
    return model


def is_compiled(model: nn.Module) -> bool:
    return model in _WATCHES


def compile_seconds() -> float:
    """Wall seconds this process has spent compiling: dynamo's frames and the backward graphs
    compiled at their first backward (torch's own total, `calculate_time_spent`)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent()["total_wall_time"])


def compiled_frames() -> int:
    """Frames dynamo has compiled in this process (first compiles, recompiles and the frames that
    resume after a graph break)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


@dataclass
class CompileWatch:
    """What compiling has cost since the last `report` (see the module docstring)."""

    seconds: float = field(default_factory=compile_seconds)
    frames: int = field(default_factory=compiled_frames)
    reported: bool = False

    def report(self) -> dict[str, float]:
        seconds, frames = compile_seconds(), compiled_frames()
        out = {"perf/compile_s": seconds - self.seconds,
               "perf/recompiles": float(frames - self.frames) if self.reported else 0.0}
        self.seconds, self.frames, self.reported = seconds, frames, True
        return out


_WATCHES: weakref.WeakKeyDictionary[nn.Module, CompileWatch] = weakref.WeakKeyDictionary()


def compile_metrics(model: nn.Module) -> dict[str, float]:
    """`perf/compile_s` and `perf/recompiles` since the last call for a compiled `model`; none
    for an eager one."""
    watch = _WATCHES.get(model)
    return {} if watch is None else watch.report()
