"""ParameterSynchronizer over Ray actors: object_store and broadcast to two rollout hosts.

One Ray session and one set of actors (trainer + 2 rollouts) for the whole module.
"""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

import tests.sync.fakes as fakes  # noqa: E402
from asyncrl.errors import SyncError  # noqa: E402
from asyncrl.sync import ParameterSynchronizer, make_transport  # noqa: E402
from asyncrl.workers.handles import Proxy  # noqa: E402
from asyncrl.workers.ray_host import RayHandle  # noqa: E402

VICTIM = "blocks.0.bias"  # an fp32 tensor

# Ray workers get this repo on their path from the driver's cwd; by-value pickling of the fakes
# keeps the tests independent of that.
ray.cloudpickle.register_pickle_by_value(fakes)


@pytest.fixture(scope="module")
def handles(ray_cluster):
    processes = [RayHandle("trainer", fakes.FakeTrainer, 0),
                 *(RayHandle(f"rollout worker {i}", fakes.RecordingRollout, i + 1) for i in range(2))]
    trainer, *rollouts = [Proxy(h) for h in processes]
    yield trainer, rollouts, processes
    for h in processes:
        h.close()


def synchronizer(handles, transport: str, **kw) -> ParameterSynchronizer:
    trainer, rollouts, processes = handles
    return ParameterSynchronizer(trainer, rollouts, make_transport(transport, trainer, rollouts, processes,
                                                                   bucket_mb=0.01), **kw)


async def checksums(trainer, rollouts) -> tuple[str, list[str]]:
    want = await trainer.weights_checksum()
    return want, [await r.weights_checksum() for r in rollouts]


async def sync_twice(sync: ParameterSynchronizer, trainer, rollouts) -> list[dict]:
    """Two syncs with a trainer update between; after each, every rollout matches the trainer."""
    metrics = []
    for _ in range(2):
        await trainer.perturb()
        metrics.append(await sync.sync())
        want, got = await checksums(trainer, rollouts)
        assert got == [want] * len(rollouts)
        assert [await r.get_version() for r in rollouts] == [sync.version] * len(rollouts)
    return metrics


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_transport_delivers_bit_identical_weights(handles, transport: str) -> None:
    trainer, rollouts, _ = handles
    asyncio.run(rollouts[0].take_events())

    async def main() -> list[dict]:
        sync = synchronizer(handles, transport, verify=True, version=10)
        try:
            return await sync_twice(sync, trainer, rollouts)
        finally:
            await sync.close()

    metrics = asyncio.run(main())
    assert all(m["sync/bytes"] > 0 and m["sync/num_rollouts"] == 2 for m in metrics)
    receive = ["receive"] if transport == "broadcast" else []
    expected = [["pause(keep)", *receive, f"load v{v}", "resume"] for v in (11, 12)]
    assert asyncio.run(rollouts[0].take_events()) == expected[0] + expected[1]


def test_pause_resume_order_across_ray(handles) -> None:
    _, rollouts, _ = handles
    asyncio.run(rollouts[1].take_events())
    sync = synchronizer(handles, "object_store", version=19)
    asyncio.run(sync.sync(interrupt=True))
    events = asyncio.run(rollouts[1].take_events())
    assert events == ["pause(abort)", "load v20", "resume"]


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_verify_catches_corruption_across_ray(handles, transport: str) -> None:
    _, rollouts, _ = handles

    async def main() -> None:
        sync = synchronizer(handles, transport, verify=True)
        try:
            await rollouts[0].corrupt_next_load(VICTIM)
            await sync.sync()
        finally:
            await sync.close()

    with pytest.raises(SyncError, match=VICTIM) as info:
        asyncio.run(main())
    assert "rollout worker 0" in str(info.value)
