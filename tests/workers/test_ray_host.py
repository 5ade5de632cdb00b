"""RayHandle and Proxy: in-process call semantics across a Ray actor, failures, placement,
clean shutdown.

Uses the test run's Ray cluster; the last test shuts it down, checks that none of its processes
survive, and starts it again for whatever runs next.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from asyncrl.errors import ConfigError, SyncError, WorkerDied  # noqa: E402
from asyncrl.workers.handles import Proxy  # noqa: E402
from asyncrl.workers.ray_host import RayHandle, ResourcePool  # noqa: E402
from tests.conftest import start_ray  # noqa: E402
from tests.workers import probes  # noqa: E402
from tests.workers.probes import Probe, broken_factory  # noqa: E402

# The Ray workers cannot import the test modules by name (pytest puts tests/ on sys.path only
# in this process), so the fakes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(probes)


@pytest.fixture(scope="module")
def probe(ray_cluster) -> RayHandle:
    handle = RayHandle("probe", Probe, num_cpus=2)
    yield handle
    handle.close()


def run(coro):
    return asyncio.run(coro)


def test_proxy_forwards_methods_by_name(probe: RayHandle) -> None:
    proxy = Proxy(probe)
    assert run(proxy.echo_kwargs(a=1)) == {"a": 1}
    assert "probe" in repr(proxy)
    with pytest.raises(AttributeError):
        proxy._private  # noqa: B018 - private names never travel


def test_coroutines_on_loop_blocking_on_worker_thread(probe: RayHandle) -> None:
    async def main():
        return await probe.call("where_async"), await probe.call("where_blocking")

    (loop_thread, loop_threads), (plain_thread, plain_threads) = run(main())
    assert plain_thread.startswith("asyncrl-compute") and not loop_thread.startswith("asyncrl-compute")
    assert (loop_threads, plain_threads) == (1, 2)  # compute thread: the host's num_cpus; loop: 1


def test_many_async_calls_in_flight(probe: RayHandle) -> None:
    async def main():
        t0 = time.monotonic()
        out = await asyncio.gather(*(probe.call("sleep_echo", i, 0.5) for i in range(200)))
        return out, time.monotonic() - t0

    out, elapsed = run(main())
    assert out == list(range(200))
    assert elapsed < 5.0  # serially it would take 100 s


def test_plain_method_does_not_block_the_loop(probe: RayHandle) -> None:
    async def main():
        blocked = asyncio.ensure_future(probe.call("block", 1.5))
        await asyncio.sleep(0.3)
        return await probe.call("now"), await blocked

    answered_at, unblocked_at = run(main())
    assert answered_at < unblocked_at


@pytest.mark.parametrize("method, error", [("fail_plain", ValueError), ("fail_async", SyncError)])
def test_exceptions_keep_their_type(probe: RayHandle, method: str, error: type) -> None:
    with pytest.raises(error) as info:
        run(probe.call(method))
    assert type(info.value) is error
    assert "failure" in str(info.value)


def test_factory_error_surfaces_with_its_type(ray_cluster) -> None:
    handle = RayHandle("broken", broken_factory)
    with pytest.raises(ConfigError, match="model.path"):
        run(handle.call("where_async"))
    handle.close()


def test_dead_actor_raises_naming_its_role(ray_cluster) -> None:
    handle = RayHandle("rollout worker 1", Probe)

    async def main():
        with pytest.raises(WorkerDied, match="rollout worker 1 died"):
            await asyncio.wait_for(handle.call("die"), 30)
        with pytest.raises(WorkerDied, match="rollout worker 1"):
            await asyncio.wait_for(handle.call("where_async"), 30)

    run(main())
    handle.close()


def test_refs_and_tensor_refs_pass_actor_to_actor(probe: RayHandle) -> None:
    async def main():
        plain = await probe.call("total", probe.call_ref("make_tensors"))
        packed = await probe.call("total", probe.tensors_ref("make_tensors"))
        echoed = await probe.call("echo", probe.call_ref("echo", [1, "two"]))
        return plain, packed, echoed

    assert run(main()) == (19.0, 19.0, [1, "two"])


def test_tensor_ref_roundtrip_is_bit_exact(probe: RayHandle) -> None:
    got = ray.get(probe.tensors_ref("make_tensors"))
    want = Probe().make_tensors()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)


def test_keyword_arguments_pass_through_even_named_method(probe: RayHandle) -> None:
    assert run(probe.call("echo_kwargs", method="m", fn=1)) == {"method": "m", "fn": 1}


def test_run_executes_in_the_worker_process(probe: RayHandle) -> None:
    assert run(probe.pid()) != os.getpid()
    assert run(probe.run(sum, [1, 2, 3])) == 6


def test_resource_pool_places_workers(ray_cluster) -> None:
    pool = ResourcePool("rollout", nnodes=1, cpus_per_node=2)
    first, second = pool.allocate(1), pool.allocate(0.5)
    assert first[1] == second[1] == 0
    with pytest.raises(ConfigError, match="rollout.num_cpus"):
        pool.allocate(1)
    handle = RayHandle("placed", Probe, num_cpus=1, placement=first)
    assert run(handle.call("echo", 7)) == 7
    handle.close()
    pool.remove()
    with pytest.raises(ConfigError):
        ResourcePool("bad", nnodes=0, cpus_per_node=1)


def test_a_pool_no_node_can_host_is_refused_before_asking_ray(ray_cluster) -> None:
    # refused from the cluster's node sizes, not after Ray's placement timeout (whose message differs)
    with pytest.raises(ConfigError, match=r"^rollout.num_cpus=10000 asks one node of the Ray cluster for 10000 CPUs"):
        ResourcePool("rollout", nnodes=1, cpus_per_node=10000)


def _session_pids() -> set[int]:
    node = ray._private.worker._global_node
    roots = [info.process.pid for infos in node.all_processes.values() for info in infos]
    pids = set(roots)
    for pid in roots:
        try:
            pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while (left := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_close_and_shutdown_leave_no_processes(ray_cluster) -> None:  # keep last: restarts Ray
    handle = RayHandle("last", Probe)
    actor_pid = run(handle.pid())
    handle.close()
    assert not _wait_gone({actor_pid}, 15.0)
    session = _session_pids()
    assert session
    ray.shutdown()
    assert not _wait_gone(session, 20.0)
    start_ray()
