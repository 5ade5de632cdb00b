"""Copy named tensors into a model's parameters in place: the one loader every weight sync
and engine uses. Tied aliases (e.g. `lm_head.weight` for tied embeddings) are accepted."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from asyncrl.errors import SyncError
from asyncrl.types import NamedTensors


def load_into(model: nn.Module, named_tensors: NamedTensors) -> int:
    """Copy each tensor into the parameter of the same name; returns how many were loaded.

    Copies, so the sources may be read-only views (object store) or reused buffers: on a GPU it
    returns once the copies are done, since the source's owner may be another process (a shared
    buffer, `asyncrl.sync.shared`) that overwrites it next. An unknown name or a shape mismatch
    raises `SyncError` naming the tensor.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    loaded = 0
    with torch.no_grad():
        for name, tensor in pairs:
            target = params.get(name)
            if target is None:
                raise SyncError(f"load_weights: the model has no parameter named {name!r}")
            if target.shape != tensor.shape:
                raise SyncError(f"load_weights: {name} has shape {tuple(target.shape)}, "
                                f"got {tuple(tensor.shape)}")
            target.copy_(tensor)
            loaded += 1
    for device in {p.device for p in params.values() if p.is_cuda}:
        torch.cuda.synchronize(device)
    return loaded
