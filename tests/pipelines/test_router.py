"""RolloutRouter: least-loaded routing, and rollout workers that die and are restarted."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.data.tasks import make_task
from asyncrl.errors import WorkerDied
from asyncrl.pipelines.router import RolloutRouter
from asyncrl.types import Group

ROW = make_task("arithmetic", 1)[0]


class DyingWorker:
    """Answers each group after a tick; `die()` makes the calls in flight and the next ones fail
    as a dead Ray actor's do, until `restart()`."""

    def __init__(self) -> None:
        self.dead = False
        self.served: list[str] = []

    def die(self) -> None:
        self.dead = True

    def restart(self) -> None:
        self.dead = False

    async def generate_scored(self, row, n, uid, mode="train", score=True, partials=(), keep=0) -> Group:
        await asyncio.sleep(0.01)
        if self.dead:
            raise WorkerDied("rollout worker died (ActorDiedError); see its log above")
        self.served.append(uid)
        return Group(uid=uid, row=row, trajectories=[])

    async def stats(self) -> dict[str, float]:
        return {}


def test_groups_of_a_dead_worker_go_to_the_others_until_the_next_sync():
    a, b = DyingWorker(), DyingWorker()
    router = RolloutRouter([a, b], max_restarts=1, log=lambda _: None)

    async def main() -> None:
        a.die()
        groups = await asyncio.gather(*(router.generate_scored(ROW, 1, f"g{k}") for k in range(4)))
        assert [g.uid for g in groups] == ["g0", "g1", "g2", "g3"]
        assert sorted(b.served) == ["g0", "g1", "g2", "g3"] and a.served == []
        a.restart()  # Ray brought it back, but it still has its initial weights
        await router.generate_scored(ROW, 1, "g4")
        assert a.served == []
        router.rejoin()  # a weight sync reached every worker
        await asyncio.gather(*(router.generate_scored(ROW, 1, f"h{k}") for k in range(4)))
        assert len(a.served) == 2 and (await router.stats())["rollout/worker_restarts"] == 1

    asyncio.run(main())


def test_a_worker_dying_past_its_restarts_stops_the_run():
    a, b = DyingWorker(), DyingWorker()
    router = RolloutRouter([a, b], max_restarts=1, log=lambda _: None)

    async def main() -> None:
        a.die()
        await router.generate_scored(ROW, 1, "g0")
        router.rejoin()
        with pytest.raises(WorkerDied):  # its second death: no restart left
            await asyncio.gather(*(router.generate_scored(ROW, 1, f"g{k}") for k in range(1, 5)))

    asyncio.run(main())


def test_without_restarts_a_dead_worker_stops_the_run():
    a, b = DyingWorker(), DyingWorker()
    router = RolloutRouter([a, b], log=lambda _: None)
    a.die()
    with pytest.raises(WorkerDied):
        asyncio.run(router.generate_scored(ROW, 1, "g0"))


class ScoringWorker:
    def __init__(self) -> None:
        self.scored: list[str] = []

    async def score(self, groups: list[Group]) -> list[Group]:
        self.scored += [g.uid for g in groups]
        return [Group(g.uid, g.row, [], baseline_reward=float(len(self.scored))) for g in groups]


def test_scoring_is_shared_by_every_worker_and_keeps_the_order():
    workers = [ScoringWorker(), ScoringWorker()]
    router = RolloutRouter(workers, log=lambda _: None)  # type: ignore[arg-type]
    groups = [Group(f"g{i}", ROW, []) for i in range(5)]
    scored = asyncio.run(router.score(groups))
    assert [g.uid for g in scored] == ["g0", "g1", "g2", "g3", "g4"]
    assert workers[0].scored == ["g0", "g2", "g4"] and workers[1].scored == ["g1", "g3"]
    assert all(g.baseline_reward is not None for g in scored)  # the workers' results, not the inputs
