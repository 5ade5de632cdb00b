"""ParameterSynchronizer on the local backend (inprocess transport), and its config errors."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.errors import ConfigError, SyncError
from asyncrl.sync import ParameterSynchronizer, default_transport
from asyncrl.workers.group import LocalHandle
from tests.sync.fakes import FakeTrainer, RecordingRollout

VICTIM = "blocks.1.weight"  # a bf16 tensor


@pytest.fixture
def handles():
    trainer = LocalHandle("trainer", FakeTrainer, 0)
    rollouts = [LocalHandle(f"rollout{i}", RecordingRollout, i + 1) for i in range(2)]
    yield trainer, rollouts
    for h in [trainer, *rollouts]:
        h.close()


def test_inprocess_delivers_bit_identical_weights(handles) -> None:
    trainer, rollouts = handles
    assert trainer.obj.weights_checksum() != rollouts[0].obj.weights_checksum()
    sync = ParameterSynchronizer(trainer, rollouts, "inprocess", verify=True)
    metrics = asyncio.run(sync.sync(1))
    for r in rollouts:
        assert r.obj.weights_checksum() == trainer.obj.weights_checksum()
        assert r.obj.version == 1
    assert metrics["sync/bytes"] == sum(t.nbytes for t in trainer.obj.export_weights().values())
    assert metrics["timing_s/param_sync"] >= metrics["sync/transfer_s"] > 0


def test_pause_transfer_resume_order(handles) -> None:
    trainer, rollouts = handles
    sync = ParameterSynchronizer(trainer, rollouts, "inprocess")

    async def main() -> None:
        await sync.setup()
        await sync.sync(3, interrupt=True)
        await sync.sync(4)

    asyncio.run(main())
    assert rollouts[1].obj.take_events() == [
        "pause(interrupt=True)", "load v3", "resume", "pause(interrupt=False)", "load v4", "resume"]


def test_verify_names_the_corrupted_tensor(handles) -> None:
    trainer, rollouts = handles
    rollouts[1].obj.corrupt_next_load(VICTIM)
    sync = ParameterSynchronizer(trainer, rollouts, "inprocess", verify=True)
    with pytest.raises(SyncError, match=VICTIM) as info:
        asyncio.run(sync.sync(1))
    assert "rollout1" in str(info.value)
    assert rollouts[1].obj.take_events()[-1] == "load v1"  # stays paused: no resume


def test_ray_transports_need_ray_handles(handles) -> None:
    trainer, rollouts = handles
    for transport in ("object_store", "broadcast"):
        with pytest.raises(ConfigError, match="ray backend"):
            ParameterSynchronizer(trainer, rollouts, transport)
    with pytest.raises(ConfigError, match="one of"):
        ParameterSynchronizer(trainer, rollouts, "carrier_pigeon")


def test_default_transports() -> None:
    assert default_transport("local") == "inprocess"
    assert default_transport("ray") == "object_store"
    assert default_transport("ray", gpus=True) == "broadcast"
