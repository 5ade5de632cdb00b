"""The rollout side of a decoupled pipeline: engines + rewards behind one worker handle.

`generate_scored(row, n, uid)` returns a scored group as soon as its n responses finish.
Around a weight sync, `pause(interrupt=True)` aborts every in-flight request (partial
rollout): each keeps its tokens, behaviour log-probs and versions, waits for `resume()`, and
continues from prompt + partial response under the new weights, so one trajectory can span
versions. `pause(interrupt=False)` only stops stepping at a step boundary. The rollout side
does not decide when to sync or what to generate; the pipeline does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.config_schema import Config
from asyncrl.sync import WeightMeta, as_pairs, checksum, export_named, recv_weights
from asyncrl.sync.tensors import NamedTensors
from asyncrl.telemetry import clock
from asyncrl.types import GenerationRequest, Group, PromptRow, Trajectory
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import Mode, RolloutWorker
from asyncrl.workers.validation import validate


class RolloutServer:
    def __init__(self, rollout: RolloutWorker, reward: RewardWorker) -> None:
        self.rollout = rollout
        self.reward = reward
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._interrupted: set[str] = set()
        self.partial_continuations = 0

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True) -> Group:
        """The group of n responses to `row`, scored as soon as the last one finishes."""
        requests = [self.rollout.request(row, f"{uid}/{i}", mode) for i in range(n)]
        trajectories = await asyncio.gather(*(self._timed_sample(r) for r in requests))
        group = Group(uid=uid, row=row, trajectories=list(trajectories))
        return (await self.score([group]))[0] if score else group

    async def score(self, groups: list[Group]) -> list[Group]:
        """Rewards in a worker thread, so the engines keep stepping meanwhile."""
        start = clock.now()
        await asyncio.to_thread(self.reward.score_groups, groups)
        end = clock.now()
        for t in (t for g in groups for t in g.trajectories):
            t.timings |= {"reward_start": start, "reward_end": end}
        return groups

    async def _timed_sample(self, request: GenerationRequest) -> Trajectory:
        start = clock.now()
        traj = await self._sample(request)
        traj.timings |= {"gen_start": start, "gen_end": clock.now()}
        return traj

    async def _sample(self, request: GenerationRequest) -> Trajectory:
        """One response, continued across interrupting syncs."""
        while True:
            traj = await self.rollout.generate(request)
            if traj.finish_reason != "aborted" or request.request_id not in self._interrupted:
                return traj
            self._interrupted.discard(request.request_id)
            await self._resumed.wait()
            request = continuation(request, traj)
            self.partial_continuations += 1

    async def pause(self, interrupt: bool = False) -> None:
        self._resumed.clear()
        for engine in self.rollout.engines:
            if interrupt:
                self._interrupted.update(t.request_id for t in engine.abort_all())
            await engine.pause()

    async def resume(self) -> None:
        for engine in self.rollout.engines:
            await engine.resume()
        self._resumed.set()

    # The rollout side's half of weight sync (see asyncrl.sync.endpoints).
    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self.rollout.load_weights(as_pairs(named_tensors), version)

    def weights_checksum(self) -> str:
        return checksum(export_named(self.rollout.engines[0].model))

    def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                        bucket_mb: float) -> None:
        self.load_weights(recv_weights(group_name, meta, bucket_mb), version)

    async def validate(self, rows: list[PromptRow], k: int, tag: str) -> dict[str, float]:
        return await validate(self.rollout, self.reward, rows, k, tag)

    def stats(self) -> dict[str, float]:
        engines = [e.stats() for e in self.rollout.engines]
        return {"rollouter/running": sum(s.running for s in engines),
                "rollouter/waiting": sum(s.waiting for s in engines),
                "rollouter/preemptions": sum(s.preemptions for s in engines),
                "rollouter/tokens_per_s": sum(s.tokens_per_s for s in engines),
                "fully_async/partial/continuations": self.partial_continuations} | self.reward.metrics()

    def get_version(self) -> int:
        return self.rollout.version


def continuation(request: GenerationRequest, partial: Trajectory) -> GenerationRequest:
    """The request that continues `partial` from prompt + its tokens, keeping their log-probs
    and versions; a fresh seed so the continuation does not replay the first segment's draws."""
    seed = None if request.params.seed is None else request.params.seed + len(partial.response_ids)
    return dataclasses.replace(
        request, params=dataclasses.replace(request.params, seed=seed),
        prefix_ids=tuple(partial.response_ids), prefix_logprobs=tuple(partial.logprobs),
        prefix_versions=tuple(partial.versions))


def build_rollout_server(cfg: Config, model: PreTrainedModel | None = None,
                         tok: PreTrainedTokenizerBase | None = None) -> RolloutServer:
    """Factory run inside the rollout host (this process, or a Ray actor)."""
    from asyncrl.workers.factory import build_rollout_side

    return RolloutServer(*build_rollout_side(cfg, model, tok))
