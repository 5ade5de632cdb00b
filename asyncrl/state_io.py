"""Run state on disk as JSON plus safetensors: nothing read back from a run directory runs code.

`save_state(tree, "x.json")` writes the tree's structure to `x.json` and its tensors (if any) to
`x.safetensors`; `load_state("x.json")` rebuilds it. A tree holds None, bools, ints, floats (NaN
and infinities too), strings, lists, tuples, dicts (keys of those kinds), torch tensors, NumPy
arrays (their bytes, dtype and shape) and the message dataclasses of `asyncrl.types` (`Group`,
`Trajectory`, `PromptRow`, ..., and `RunLength`): a closed list, each rebuilt by its own
constructor from its fields. Anything else is refused when written (a programmer's error), and a
name outside the list is refused when read. Floats go through `repr`, so they come back bit for
bit: optimizer and RNG states resume exactly.

JSON cannot run code and safetensors holds raw tensor bytes behind a length-checked header, so a
crafted file gives a one-line `CheckpointError` naming it, never an import or a call. Not here:
checksums (`asyncrl.pipelines.manifest`) and what a checkpoint holds (`asyncrl.pipelines.checkpoint`).

Example: `{"state": {0: {"step": tensor(3.)}}, "betas": (0.9, 0.95)}` is written as
`{"state": {"$dict": [[0, {"step": {"$tensor": "t0"}}]]}, "betas": {"$tuple": [0.9, 0.95]}}`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.errors import CheckpointError
from asyncrl.fsutil import atomic_write_text
from asyncrl.types import EngineStats, GenerationRequest, Group, PromptRow, RunLength, SamplingParams, Trajectory

_TYPES: dict[str, type] = {c.__name__: c for c in (
    PromptRow, SamplingParams, GenerationRequest, Trajectory, Group, EngineStats)}
"""The dataclasses a saved tree may hold, by name."""
_MARKS = ("$tensor", "$ndarray", "$tuple", "$dict", "$type")
_SCALARS = (type(None), bool, int, float, str)


class _Encoder:
    """One tree's JSON-ready structure; its tensors collected by key (a shared view once)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._seen: dict[tuple[Any, ...], str] = {}
        self._storages: set[int] = set()

    def encode(self, x: Any) -> Any:
        if isinstance(x, _SCALARS):
            return x
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, torch.Tensor):
            return {"$tensor": self._tensor(x)}
        if isinstance(x, np.ndarray):
            assert x.dtype.kind in "biuf", f"cannot save a NumPy array of dtype {x.dtype}"
            raw = torch.frombuffer(bytearray(np.ascontiguousarray(x).tobytes()), dtype=torch.uint8)
            return {"$ndarray": self._tensor(raw), "dtype": x.dtype.str, "shape": list(x.shape)}
        if isinstance(x, list):
            return [self.encode(v) for v in x]
        if isinstance(x, tuple):
            return {"$tuple": [self.encode(v) for v in x]}
        if isinstance(x, dict):
            return self._dict(x)
        if isinstance(x, RunLength):
            return {"$type": "RunLength", "runs": self.encode(x.runs), "length": len(x)}
        name = type(x).__name__
        assert _TYPES.get(name) is type(x), f"cannot save a {type(x).__qualname__} in a checkpoint (add it to _TYPES)"
        fields = {f.name: self.encode(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
        return {"$type": name, "fields": fields}

    def _dict(self, x: dict[Any, Any]) -> Any:
        if all(isinstance(k, str) and not k.startswith("$") for k in x):
            return {k: self.encode(v) for k, v in x.items()}
        assert all(isinstance(k, _SCALARS) for k in x), "dict keys must be None, bool, int, float or str"
        return {"$dict": [[k, self.encode(v)] for k, v in x.items()]}

    def _tensor(self, t: torch.Tensor) -> str:
        t = t.detach().cpu()
        storage = t.untyped_storage().data_ptr()
        view = (storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view in self._seen:  # the same tensor twice (tied weights): one entry, both places
            return self._seen[view]
        key = f"t{len(self.tensors)}"
        # safetensors refuses tensors that share memory: a second view of a storage is copied
        self.tensors[key] = t.clone() if storage in self._storages or not t.is_contiguous() else t
        self._storages.add(storage)
        self._seen[view] = key
        return key


def save_state(tree: Any, path: Path) -> None:
    """`tree` as `path` (JSON) and, if it holds tensors, `path.with_suffix(".safetensors")`."""
    from safetensors.torch import save_file

    enc = _Encoder()
    text = json.dumps(enc.encode(tree))
    if enc.tensors:
        save_file(enc.tensors, str(path.with_suffix(".safetensors")))
    atomic_write_text(path, text)


def load_state(path: Path) -> Any:
    """The tree `save_state` wrote at `path`; a damaged or crafted file is a one-line
    `CheckpointError` naming it."""
    tree = read_json(path)
    tensors = read_tensors(path.with_suffix(".safetensors")) if _has_tensors(tree) else {}
    try:
        return _decode(tree, tensors)
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise CheckpointError(f"{path} does not hold a saved state ({type(exc).__name__}: {exc})") from None


def read_json(path: Path) -> Any:
    """`path` parsed as JSON (never unpickled); a damaged file is a one-line `CheckpointError`."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{path} is not valid JSON ({type(exc).__name__}); the checkpoint is damaged") from None


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; a damaged one is a one-line `CheckpointError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        cause = " ".join(str(exc).split())[:160]
        raise CheckpointError(f"{path} is not a readable safetensors file ({cause}); "
                              "the checkpoint is damaged") from None


def check_weights(tensors: dict[str, torch.Tensor], path: Path, zero_matrices: bool = False) -> None:
    """Refuse weights that no training produces: a value that is not finite, or (unless
    `zero_matrices`: the critic's zero-initialised value head) a matrix that is all zero (a zeroed
    file that its checksums describe)."""
    for name, t in tensors.items():
        if not t.is_floating_point() or t.numel() == 0:
            continue
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: weight {name} holds NaN or infinite values; "
                                  "resume from an earlier checkpoint (trainer.resume_mode=.../global_step_K)")
        if not zero_matrices and t.dim() >= 2 and not bool(t.any()):
            raise CheckpointError(f"{path}: weight {name} is all zero; "
                                  "resume from an earlier checkpoint (trainer.resume_mode=.../global_step_K)")


def _has_tensors(tree: Any) -> bool:
    if isinstance(tree, dict):
        return "$tensor" in tree or "$ndarray" in tree or any(_has_tensors(v) for v in tree.values())
    return isinstance(tree, list) and any(_has_tensors(v) for v in tree)


def _decode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if not isinstance(x, dict):
        return x
    mark = next((m for m in _MARKS if m in x), None)
    if mark is None:
        return {k: _decode(v, tensors) for k, v in x.items()}
    if mark == "$tensor":
        return tensors[x["$tensor"]]
    if mark == "$ndarray":
        dtype = np.dtype(x["dtype"])
        if dtype.kind not in "biuf":
            raise TypeError(f"an array of dtype {dtype}")
        raw = tensors[x["$ndarray"]].numpy().tobytes()
        return np.frombuffer(raw, dtype=dtype).reshape(x["shape"]).copy()
    if mark == "$tuple":
        return tuple(_decode(v, tensors) for v in x["$tuple"])
    if mark == "$dict":
        return {_key(k): _decode(v, tensors) for k, v in x["$dict"]}
    return _instance(x, tensors)


def _key(k: Any) -> Any:
    if not isinstance(k, _SCALARS):
        raise TypeError(f"a dict key of type {type(k).__name__}")
    return k


def _instance(x: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    name = x["$type"]
    if name == "RunLength":
        return RunLength(_decode(x["runs"], tensors), int(x["length"]))
    if name not in _TYPES:
        raise TypeError(f"{name!r} is not a type a checkpoint may hold")
    fields = x["fields"]
    if not isinstance(fields, dict):
        raise TypeError(f"the fields of a {name} must be an object")
    return _TYPES[name](**{k: _decode(v, tensors) for k, v in fields.items()})
