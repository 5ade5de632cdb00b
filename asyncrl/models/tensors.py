"""Named weight tensors: export from a model, describe (meta), checksum, compare.

Both halves of a weight sync use these, so the trainer and the rollout side name, order and
hash tensors identically. Tied weights are exported once, under their first name
(`model.named_parameters()` order); a loader accepts the alias names too.

Not here: moving tensors between processes (`asyncrl.sync`) or loading them into a model
(`weights.load_into`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from asyncrl.types import NamedTensors, WeightMeta


def export_named(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name, detached, no copy; each tied tensor once."""
    return {name: p.detach() for name, p in model.named_parameters()}


def as_pairs(named: NamedTensors) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a dict or an iterable of pairs (what `load_weights` takes)."""
    return list(named.items()) if isinstance(named, Mapping) else list(named)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    assert isinstance(dtype, torch.dtype), f"not a torch dtype: {name!r}"
    return dtype


def weight_meta(named: NamedTensors) -> list[WeightMeta]:
    """The (name, shape, dtype) list a transport is set up from, in export order."""
    return [(name, tuple(t.shape), dtype_name(t.dtype)) for name, t in as_pairs(named)]


def meta_nbytes(meta: Iterable[WeightMeta]) -> int:
    total = 0
    for _, shape, dtype in meta:
        total += _numel(shape) * to_dtype(dtype).itemsize
    return total


def tensor_digest(tensor: torch.Tensor) -> str:
    """A hash of the tensor's exact bytes (dtype and shape are recorded beside it)."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(raw.numpy().data, digest_size=12).hexdigest()


def checksum(named: NamedTensors) -> str:
    """One line per tensor, "name dtype shape digest", in export order.

    A string (cheap to send back from any host) that `first_difference` can take apart to
    name the first tensor that differs. Bit-exact: a cast or a single flipped bit changes it.
    """
    lines = []
    for name, t in as_pairs(named):
        shape = "x".join(str(d) for d in t.shape) or "scalar"
        lines.append(f"{name} {dtype_name(t.dtype)} {shape} {tensor_digest(t)}")
    return "\n".join(lines)


def first_difference(expected: str, actual: str) -> str | None:
    """The first tensor name whose checksum line differs (or is missing/extra); None if equal."""
    want, got = _parse(expected), _parse(actual)
    for name, line in want.items():
        if got.get(name) != line:
            return name
    extra = [name for name in got if name not in want]
    return extra[0] if extra else None


def _parse(checksum_text: str) -> dict[str, str]:
    rows = (line.split(" ", 1) for line in checksum_text.splitlines() if line)
    return {name: rest for name, rest in rows}


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
