"""ParameterSynchronizer over Ray actors: object_store and broadcast to two rollout hosts.

One Ray session and one set of actors (trainer + 2 rollouts) for the whole module.
"""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

import tests.sync.fakes as fakes  # noqa: E402
from asyncrl.errors import SyncError  # noqa: E402
from asyncrl.sync import ParameterSynchronizer  # noqa: E402
from asyncrl.workers.ray_host import make_handle  # noqa: E402

VICTIM = "blocks.0.bias"  # an fp32 tensor

# Ray workers get this repo on their path from the driver's cwd; by-value pickling of the fakes
# keeps the tests independent of that.
ray.cloudpickle.register_pickle_by_value(fakes)


@pytest.fixture(scope="module")
def handles():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = make_handle("trainer", fakes.FakeTrainer, 0, backend="ray")
    rollouts = [make_handle(f"rollout{i}", fakes.RecordingRollout, i + 1, backend="ray")
                for i in range(2)]
    yield trainer, rollouts
    for h in [trainer, *rollouts]:
        h.close()
    ray.shutdown()


async def checksums(trainer, rollouts) -> tuple[str, list[str]]:
    want = await trainer.call("weights_checksum")
    return want, [await r.call("weights_checksum") for r in rollouts]


async def sync_twice(sync: ParameterSynchronizer, trainer, rollouts, first: int) -> list[dict]:
    """Two syncs with a trainer update between; after each, every rollout matches the trainer."""
    metrics = []
    for version in (first, first + 1):
        await trainer.call("perturb")
        metrics.append(await sync.sync(version))
        want, got = await checksums(trainer, rollouts)
        assert got == [want] * len(rollouts)
        assert [await r.call("get_version") for r in rollouts] == [version] * len(rollouts)
    return metrics


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_transport_delivers_bit_identical_weights(handles, transport: str) -> None:
    trainer, rollouts = handles
    asyncio.run(rollouts[0].call("take_events"))

    async def main() -> list[dict]:
        sync = ParameterSynchronizer(trainer, rollouts, transport, verify=True, bucket_mb=0.01)
        try:
            return await sync_twice(sync, trainer, rollouts, first=10)
        finally:
            await sync.close()

    metrics = asyncio.run(main())
    assert all(m["sync/bytes"] > 0 and m["sync/num_rollouts"] == 2 for m in metrics)
    receive = ["receive"] if transport == "broadcast" else []
    expected = [["pause(interrupt=False)", *receive, f"load v{v}", "resume"] for v in (10, 11)]
    assert asyncio.run(rollouts[0].call("take_events")) == expected[0] + expected[1]


def test_pause_resume_order_across_ray(handles) -> None:
    trainer, rollouts = handles
    asyncio.run(rollouts[1].call("take_events"))
    sync = ParameterSynchronizer(trainer, rollouts, "object_store")
    asyncio.run(sync.sync(20, interrupt=True))
    events = asyncio.run(rollouts[1].call("take_events"))
    assert events == ["pause(interrupt=True)", "load v20", "resume"]


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_verify_catches_corruption_across_ray(handles, transport: str) -> None:
    trainer, rollouts = handles

    async def main() -> None:
        sync = ParameterSynchronizer(trainer, rollouts, transport, verify=True)
        try:
            await rollouts[0].call("corrupt_next_load", VICTIM)
            await sync.sync(30)
        finally:
            await sync.close()

    with pytest.raises(SyncError, match=VICTIM):
        asyncio.run(main())
