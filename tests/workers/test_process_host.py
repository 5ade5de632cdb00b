"""ProcessHandle: in-process call semantics across a spawned process, failures, cancellation,
clean shutdown."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import torch

from asyncrl.errors import ConfigError, SyncError, WorkerDied
from asyncrl.workers.handles import Proxy
from asyncrl.workers.process_host import ProcessHandle, RemoteTraceback
from tests.workers.probes import Probe, broken_factory


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def probe() -> ProcessHandle:
    handle = ProcessHandle("probe", Probe, num_threads=2)
    yield handle
    handle.close()


def test_proxy_forwards_methods_by_name(probe: ProcessHandle) -> None:
    proxy = Proxy(probe)
    assert run(proxy.echo_kwargs(a=1, method="m")) == {"a": 1, "method": "m"}
    assert "probe" in repr(proxy)


def test_coroutines_on_loop_blocking_on_compute_thread(probe: ProcessHandle) -> None:
    async def main():
        return await probe.call("where_async"), await probe.call("where_blocking")

    (loop_thread, loop_threads), (plain_thread, plain_threads) = run(main())
    assert plain_thread.startswith("asyncrl-compute") and not loop_thread.startswith("asyncrl-compute")
    assert (loop_threads, plain_threads) == (1, 2)


def test_many_calls_in_flight_and_blocking_ones_do_not_block_the_loop(probe: ProcessHandle) -> None:
    async def main():
        t0 = time.monotonic()
        out = await asyncio.gather(*(probe.call("sleep_echo", i, 0.5) for i in range(100)))
        elapsed = time.monotonic() - t0
        blocked = asyncio.ensure_future(probe.call("block", 1.0))
        await asyncio.sleep(0.3)
        return out, elapsed, await probe.call("now"), await blocked

    out, elapsed, answered_at, unblocked_at = run(main())
    assert out == list(range(100))
    assert elapsed < 10.0  # serially it would take 50 s
    assert answered_at < unblocked_at


@pytest.mark.parametrize("method, error", [("fail_plain", ValueError), ("fail_async", SyncError)])
def test_exceptions_keep_their_type_and_remote_traceback(probe: ProcessHandle, method: str, error: type) -> None:
    with pytest.raises(error) as info:
        run(probe.call(method))
    assert type(info.value) is error and "failure" in str(info.value)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert method in str(info.value.__cause__)  # the frame in the worker's process


def test_tensors_travel_by_value_bit_exact(probe: ProcessHandle) -> None:
    got = run(probe.call("make_tensors"))
    for name, tensor in Probe().make_tensors().items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)
    assert run(probe.call("total", got)) == 19.0


def test_run_executes_in_the_worker_process_in_its_own_session(probe: ProcessHandle) -> None:
    pid = run(probe.pid())
    assert pid != os.getpid()
    assert os.getsid(pid) == pid != os.getsid(0)  # a Ctrl-C to the driver's group does not reach it
    assert run(probe.run(sum, [1, 2, 3])) == 6


def test_cancelling_a_call_cancels_it_in_the_worker(probe: ProcessHandle, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"

    async def main():
        call = asyncio.ensure_future(probe.call("wait_cancelled", str(marker)))
        await asyncio.sleep(0.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(main())
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cancelled"
    assert run(probe.call("echo", 3)) == 3  # the worker serves on


def test_factory_error_surfaces_with_its_type() -> None:
    handle = ProcessHandle("broken", broken_factory)
    with pytest.raises(ConfigError, match="model.path"):
        run(handle.call("where_async"))
    handle.close()


def test_dead_process_fails_calls_in_flight_and_later_naming_its_role() -> None:
    handle = ProcessHandle("rollout worker 1", Probe)

    async def main():
        pending = asyncio.ensure_future(handle.call("sleep_echo", 0, 60))
        await asyncio.sleep(0.2)
        with pytest.raises(WorkerDied, match="rollout worker 1 died"):
            await asyncio.wait_for(handle.call("die"), 30)
        with pytest.raises(WorkerDied, match="rollout worker 1 died"):
            await asyncio.wait_for(pending, 30)
        with pytest.raises(WorkerDied, match="rollout worker 1"):
            await handle.call("echo", 1)

    run(main())
    assert handle.process.exitcode == 1
    handle.close()


def test_close_closes_the_worker_and_ends_the_process(tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    handle = ProcessHandle("last", Probe, "t", str(marker))
    assert run(handle.call("echo", 1)) == 1
    handle.close()
    assert marker.read_text() == "closed"
    assert handle.process.exitcode == 0 and not handle.process.is_alive()
    handle.close()  # idempotent
    with pytest.raises(WorkerDied):
        run(handle.call("echo", 1))
