"""Host-to-device copies of a step's small inputs without stalling the host.

A plain `tensor.to("cuda")` from ordinary (pageable) memory waits for the device to finish all
work queued before it, so a step that copies its sampling settings after queueing the decode
would sit idle until the decode is done. Here the host tensor is first copied into pinned
memory (torch's caching host allocator: cheap, and a block is reused only once the copies
recorded on it have completed) and then sent with `non_blocking=True`. The step's single
device-to-host copy at its end is the only synchronisation.

On the CPU both functions are plain copies. Not here: device-to-host copies (the step runner
does its one), anything asynchronous across steps.
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, without waiting for the device's queued work."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_from_host(dst: torch.Tensor, host: torch.Tensor) -> None:
    """dst.copy_(host) into an existing buffer (a CUDA graph's static input), asynchronously."""
    if dst.device.type != "cuda":
        dst.copy_(host)
        return
    dst.copy_(host.pin_memory(), non_blocking=True)
