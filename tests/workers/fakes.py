"""A named fake engine for rollout-host tests: each response takes a scripted number of steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from asyncrl.types import EngineStats, GenerationRequest, Trajectory

STEP_S = 0.002


class ScriptedEngine:
    """Response `{uid}/{i}` is `length(i)` tokens long and takes that many steps of STEP_S; an
    abort resolves its `generate` with the tokens it has so far (finish_reason "aborted")."""

    def __init__(self, length: Callable[[str], int]) -> None:
        self.length = length
        self._running: dict[str, tuple[asyncio.Future[Trajectory], GenerationRequest, float]] = {}
        self.aborted: list[str] = []

    async def generate(self, request: GenerationRequest) -> Trajectory:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Trajectory] = loop.create_future()
        self._running[request.request_id] = (future, request, loop.time())
        n = self.length(request.request_id)
        timer = loop.call_later(n * STEP_S, lambda: self._finish(request.request_id, n, "stop"))
        try:
            return await future
        finally:
            timer.cancel()
            self._running.pop(request.request_id, None)

    def _finish(self, rid: str, n: int, reason: str) -> Trajectory | None:
        entry = self._running.pop(rid, None)
        if entry is None or entry[0].done():
            return None
        traj = Trajectory(rid, entry[1].prompt_ids, [1] * n, [-0.5] * n, [0] * n, reason)  # type: ignore[arg-type]
        entry[0].set_result(traj)
        return traj

    async def abort(self, request_ids: Iterable[str]) -> list[Trajectory]:
        now = asyncio.get_running_loop().time()
        out = []
        for rid in request_ids:
            if rid in self._running:
                done = int((now - self._running[rid][2]) / STEP_S)
                traj = self._finish(rid, min(done, self.length(rid) - 1), "aborted")
                if traj is not None:
                    self.aborted.append(rid)
                    out.append(traj)
        return out

    async def abort_all(self) -> list[Trajectory]:
        return await self.abort(list(self._running))

    async def pause(self, mode: str = "keep") -> list[Trajectory]:
        return await self.abort_all() if mode == "abort" else []

    async def resume(self) -> None:
        pass

    async def load_weights(self, named_tensors, version: int) -> None:
        pass

    def weights_checksum(self) -> str:
        return ""

    def stats(self) -> EngineStats:
        return EngineStats(len(self._running), 0, 0, 0, 1, 0, 0.0, 0)
