"""ParameterSynchronizer in one process (inprocess transport): order, versions, verification."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.errors import ConfigError, SyncError
from asyncrl.sync import ParameterSynchronizer, default_transport, make_transport
from tests.sync.fakes import FakeTrainer, RecordingRollout

VICTIM = "blocks.1.weight"  # a bf16 tensor


@pytest.fixture
def workers():
    return FakeTrainer(0), [RecordingRollout(i + 1) for i in range(2)]


def synchronizer(trainer, rollouts, **kw) -> ParameterSynchronizer:
    return ParameterSynchronizer(trainer, rollouts, make_transport("inprocess", trainer, rollouts), **kw)


def test_inprocess_delivers_bit_identical_weights(workers) -> None:
    trainer, rollouts = workers

    async def main() -> dict[str, float]:
        assert await trainer.weights_checksum() != await rollouts[0].weights_checksum()
        metrics = await synchronizer(trainer, rollouts, verify=True).sync()
        for r in rollouts:
            assert await r.weights_checksum() == await trainer.weights_checksum()
        return metrics

    metrics = asyncio.run(main())
    assert [r.version for r in rollouts] == [1, 1]
    assert metrics["sync/bytes"] == sum(t.nbytes for t in asyncio.run(trainer.export_weights()).values())
    assert metrics["timing_s/param_sync"] >= metrics["sync/transfer_s"] > 0


def test_versions_count_syncs_and_a_push_counts_none(workers) -> None:
    trainer, rollouts = workers
    sync = synchronizer(trainer, rollouts)

    async def main() -> None:
        await sync.setup()
        await sync.push(3)
        await sync.sync(interrupt=True)
        await sync.sync()

    asyncio.run(main())
    assert sync.version == 5 and sync.transfers == 3 and not sync.behind
    assert rollouts[1].events == [
        "pause(keep)", "load v3", "resume", "pause(abort)", "load v4", "resume", "pause(keep)", "load v5", "resume"]


def test_verify_names_the_corrupted_tensor(workers) -> None:
    trainer, rollouts = workers
    asyncio.run(rollouts[1].corrupt_next_load(VICTIM))
    sync = synchronizer(trainer, rollouts, verify=True)
    with pytest.raises(SyncError, match=VICTIM) as info:
        asyncio.run(sync.sync())
    assert "rollout worker 1" in str(info.value)
    assert rollouts[1].events[-1] == "load v1"  # stays paused: no resume
    assert sync.version == 0  # the failed sync published nothing


def test_cross_process_transports_need_worker_processes(workers) -> None:
    trainer, rollouts = workers
    for transport in ("object_store", "broadcast", "ipc"):
        with pytest.raises(ConfigError, match="backend ray or processes"):
            make_transport(transport, trainer, rollouts)
    with pytest.raises(ConfigError, match="one of"):
        make_transport("carrier_pigeon", trainer, rollouts)


def test_default_transports() -> None:
    assert default_transport("local") == "inprocess"
    assert default_transport("ray") == "object_store"
    assert default_transport("ray", gpus=True) == "broadcast"
    assert default_transport("processes") == default_transport("processes", gpus=True) == "ipc"
