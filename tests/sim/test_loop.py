import asyncio
import time

import pytest

from asyncrl.sim.loop import SimDeadlock, run_virtual
from asyncrl.telemetry import clock
from asyncrl.telemetry.metrics import timer


def test_virtual_time_jumps_and_keeps_order():
    order = []

    async def worker(name: str, delay: float) -> float:
        await asyncio.sleep(delay)
        order.append(name)
        return asyncio.get_running_loop().time()

    async def main() -> list[float]:
        return await asyncio.gather(worker("slow", 3600.0), worker("fast", 1.5), worker("mid", 60.0))

    start = time.perf_counter()
    ends, elapsed = run_virtual(main())
    assert time.perf_counter() - start < 1.0  # an hour of virtual time in well under a second
    assert ends == [3600.0, 1.5, 60.0]
    assert elapsed == pytest.approx(3600.0, rel=0, abs=1e-9)
    assert order == ["fast", "mid", "slow"]


def test_timers_and_clock_read_virtual_time_inside_and_wall_time_after():
    async def main() -> dict[str, float]:
        metrics: dict[str, float] = {}
        with timer("work", metrics):
            await asyncio.sleep(42.0)
        metrics["now"] = clock.now()
        return metrics

    metrics, _ = run_virtual(main())
    assert metrics["timing_s/work"] == pytest.approx(42.0, rel=0, abs=1e-9)
    assert metrics["now"] == pytest.approx(42.0, rel=0, abs=1e-9)
    assert abs(clock.now() - time.time()) < 5  # restored


def test_deadlock_is_an_error_not_a_hang():
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimDeadlock):
        run_virtual(main())


def test_cancelled_timers_never_fire_and_the_rest_keep_time_and_order():
    """Past 100 timers with most cancelled, the loop drops them in bulk (as CPython's does)."""
    fired: list[tuple[int, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        handles = [loop.call_later(1.0 + i, lambda i=i: fired.append((i, loop.time()))) for i in range(300)]
        for i, handle in enumerate(handles):
            if i % 3:
                handle.cancel()
        await asyncio.sleep(2 * 86400.0)  # longer than one jump (asyncio caps a wait at a day)

    _, elapsed = run_virtual(main())
    assert [i for i, _ in fired] == list(range(0, 300, 3))
    assert [t for _, t in fired] == pytest.approx([1.0 + i for i in range(0, 300, 3)], rel=0, abs=1e-6)
    assert elapsed == pytest.approx(2 * 86400.0, rel=0, abs=1e-6)
