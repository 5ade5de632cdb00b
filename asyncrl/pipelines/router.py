"""Every rollout worker of a run behind one door (`RolloutRouter`): least-loaded routing per
group, and workers that die and are restarted.

Not here: building the workers (`asyncrl.substrates`), when to generate or sync (the pipelines).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from asyncrl.errors import WorkerDied
from asyncrl.roles import RolloutSide
from asyncrl.types import Group, Mode, PromptRow, Trajectory


class RolloutRouter:
    """Every rollout worker behind one door: each group goes to the least-loaded worker.

    The only router: a worker holds one engine, so a group's responses share its KV cache.
    A worker that dies (`WorkerDied`) while Ray may restart it (`rollout.max_restarts`) is set
    aside: its groups are generated again from the start on the others, and it rejoins once the
    next weight sync has given it the run's weights (`rejoin`)."""

    def __init__(self, workers: Sequence[RolloutSide], max_restarts: int = 0, *,
                 log: Callable[[str], None]) -> None:
        assert workers, "a run needs at least one rollout worker"
        self.workers = list(workers)
        self.max_restarts = max_restarts
        self.log = log
        self._in_flight = [0] * len(self.workers)
        self._owner: dict[str, int] = {}
        self._restarts = [0] * len(self.workers)
        self._waiting_for_sync: set[int] = set()

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group:
        while True:
            i = self._pick()
            restarts_seen = self._restarts[i]
            self._in_flight[i] += 1
            self._owner[uid] = i
            try:
                group = await self.workers[i].generate_scored(row, n, uid, mode, score, partials, keep)
            except WorkerDied:
                if not self._restarted(i, restarts_seen):
                    raise
            else:
                for t in group.trajectories:
                    t.timings["engine"] = i  # the trace draws each engine's requests on its own track
                return group
            finally:
                self._in_flight[i] -= 1
                self._owner.pop(uid, None)

    def _ready(self) -> list[int]:
        """Workers taking groups now (not set aside until a weight sync)."""
        ready = [i for i in range(len(self.workers)) if i not in self._waiting_for_sync]
        if not ready:
            raise WorkerDied("every rollout worker died; the run stops")
        return ready

    def _pick(self) -> int:
        return min(self._ready(), key=lambda i: self._in_flight[i])

    def _restarted(self, i: int, restarts_seen: int) -> bool:
        """Worker i died: count a restart (once per death, however many groups saw it) and set
        it aside; False when it may not restart again."""
        if i in self._waiting_for_sync or self._restarts[i] != restarts_seen:
            return True  # another group saw this death first
        if self._restarts[i] >= self.max_restarts:
            return False
        self._restarts[i] += 1
        self._waiting_for_sync.add(i)
        self.log(f"rollout worker {i} died: restart {self._restarts[i]} of rollout.max_restarts={self.max_restarts}; "
                 "its groups go to the other workers until the next weight sync")
        return True

    def rejoin(self) -> None:
        """After a weight sync every worker has the run's weights: restarted ones take groups again."""
        self._waiting_for_sync.clear()

    async def score(self, groups: list[Group]) -> list[Group]:
        """Score in every ready worker's reward pool at once, a share of the groups each."""
        ready = self._ready()[: max(len(groups), 1)]
        parts = await asyncio.gather(*(self.workers[i].score(groups[k::len(ready)]) for k, i in enumerate(ready)))
        out = list(groups)
        for k, part in enumerate(parts):
            out[k::len(ready)] = part
        return out

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Abort these requests (`{uid}/{i}`) on the workers running their groups."""
        by_worker: dict[int, list[str]] = {}
        for rid in request_ids:
            owner = self._owner.get(rid.rpartition("/")[0])
            if owner is not None:
                by_worker.setdefault(owner, []).append(rid)
        parts = await asyncio.gather(*(self.workers[i].abort(ids) for i, ids in by_worker.items()))
        return [t for part in parts for t in part]

    async def stats(self) -> dict[str, float]:
        """Every worker's stats, summed (they are counts and rates), and the restarts."""
        total: dict[str, float] = {"rollout/worker_restarts": float(sum(self._restarts))}
        for stats in await asyncio.gather(*(w.stats() for w in self.workers)):
            for key, value in stats.items():
                total[key] = total.get(key, 0.0) + value
        return total
