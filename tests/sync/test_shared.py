"""Transport "ipc": one buffer shared between a trainer process and rollout processes (shared
memory on the CPU; CUDA IPC handles on a GPU, tests/gpu)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.errors import ConfigError, SyncError
from asyncrl.models.tensors import weight_meta
from asyncrl.sync import ParameterSynchronizer, make_transport
from asyncrl.sync.shared import (
    attach_shared,
    close_shared,
    open_shared,
    recv_shared,
    send_shared,
    shared_channel,
    shared_handles,
)
from asyncrl.workers.handles import Proxy
from asyncrl.workers.process_host import ProcessHandle
from tests.workers.probes import Probe, SmallModel, TrainerProbe, rollout_probe


def test_a_channel_lays_out_one_buffer_per_dtype_and_round_trips() -> None:
    named = {n: p.detach() for n, p in SmallModel(seed=3).named_parameters()}
    meta = weight_meta(named)
    open_shared("t-send", meta, "cpu")
    try:
        sender = shared_channel("t-send")
        assert sender is not None
        assert sorted(str(b.dtype) for b in sender.buffers) == ["torch.bfloat16", "torch.float32"]
        assert all(b.is_shared() for b in sender.buffers)
        with pytest.raises(SyncError, match="already has"):
            attach_shared("t-send", meta, shared_handles("t-send"))
        attach_shared("t-recv", meta, shared_handles("t-send"))  # as another process would
        receiver = shared_channel("t-recv")
        assert receiver is not None
        assert send_shared(sender, named) == sum(t.numel() * t.element_size() for t in named.values())
        got = recv_shared(receiver)
        assert list(got) == list(named) and all(torch.equal(got[n], named[n]) for n in named)
        with pytest.raises(SyncError, match="names differ"):
            send_shared(sender, dict(reversed(named.items())))
    finally:
        close_shared("t-send")
        close_shared("t-recv")
    assert shared_channel("t-send") is None


def test_ipc_syncs_weights_between_processes_bit_for_bit(device: str = "cpu") -> None:
    """Also run on CUDA by tests/gpu/test_cuda_ipc.py."""
    trainer_host = ProcessHandle("trainer", TrainerProbe, device)
    rollout_hosts = [ProcessHandle(f"rollout worker {i}", rollout_probe, device) for i in range(2)]
    trainer, rollouts = Proxy(trainer_host), [Proxy(h) for h in rollout_hosts]
    transport = make_transport("ipc", trainer, rollouts, [trainer_host, *rollout_hosts], device=device)
    sync = ParameterSynchronizer(trainer, rollouts, transport, verify=True)

    async def main():
        await sync.setup()
        before = await rollouts[0].weights_checksum()
        await sync.sync()
        first = await rollouts[1].weights_checksum()
        await trainer.perturb()  # the next sync carries the change through the same buffer
        await sync.sync()
        second = [await r.weights_checksum() for r in rollouts]
        await sync.close()
        return before, first, second, await trainer.weights_checksum()

    try:
        before, first, second, want = asyncio.run(main())
    finally:
        for host in (trainer_host, *rollout_hosts):
            host.close()
    assert before != first != want
    assert second == [want, want]


def test_object_store_needs_ray_processes() -> None:
    host = ProcessHandle("trainer", Probe)
    try:
        with pytest.raises(ConfigError, match="backend=ray"):
            make_transport("object_store", Proxy(host), [Proxy(host)], [host, host])
    finally:
        host.close()
