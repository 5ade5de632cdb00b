"""The rollout host (`asyncrl.roles.RolloutSide`): one engine plus the reward worker.

`generate_scored(row, n, uid)` returns a scored group as soon as its n responses finish.
Around a weight sync, `pause("abort")` interrupts every request in flight (partial rollout):
each keeps its tokens, behaviour log-probs and versions, waits for `resume()`, and continues
from prompt + partial response under the new weights, so one trajectory can span versions.
`pause("keep")` only stops stepping at a step boundary. `abort(ids)` stops requests for good
(tail batching's extra responses): they come back in their group as finish_reason "aborted",
unscored. The host does not decide when to sync or what to generate; the pipeline does.

With `rollout.multi_turn.enable` each response is an episode (`asyncrl.agents`): the host runs
`episode(row, client, partial)` instead of one `engine.generate`, and the client's model turns
go through the same pause/park/continue path (a turn interrupted by a sync continues under the
new weights). `abort(ids)` of an episode aborts its model turn in flight, or, during a tool
call, lets the call finish and stops the episode before its next turn; the partial episode
comes back in its group as "aborted" and a later `generate_scored(partials=...)` continues it.
Episodes are scored on their whole response (every turn and tool message, as verl's reward
managers decode it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence

from asyncrl.agents.episode import EngineClient, Episode
from asyncrl.models.tensors import as_pairs
from asyncrl.roles import Engine, PauseMode
from asyncrl.sync import recv_weights
from asyncrl.telemetry import clock
from asyncrl.types import GenerationRequest, Group, Mode, NamedTensors, PromptRow, Trajectory, WeightMeta
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder


class RolloutServer:
    def __init__(self, engine: Engine, requests: RequestBuilder, reward: RewardWorker,
                 score_each: bool = False, episode: Episode | None = None) -> None:
        self.engine = engine
        self.requests = requests
        self.reward = reward
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._live: set[str] = set()
        """Request ids inside `engine.generate` right now."""
        self._interrupted: set[str] = set()
        """Ids a pause aborted: they continue after `resume` (unless `abort`ed meanwhile)."""
        self._parked: dict[str, Trajectory] = {}
        """Interrupted requests waiting for `resume`, with their partial trajectories."""
        self.partial_continuations = 0
        self.score_each = score_each
        """Reward scheduler: score each response as soon as it finishes (else each group at its end)."""
        self.episode = episode
        """Multi-turn: each response is this episode (None: one generate, the single-turn path)."""
        self._episodes: set[str] = set()
        """Episode ids running now."""
        self._turn_of: dict[str, str] = {}
        """Episode id -> the request id of its model turn inside `engine.generate`."""
        self._stopped: set[str] = set()
        """Episodes aborted for good: they stop before their next model turn."""

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group:
        """The group of n responses to `row`, scored as soon as the last one finishes (with
        `score_each`, each as soon as it finishes); responses of a stopped run (`partials`) are
        kept if finished, else continued; `keep` > 0: done at the first `keep` finishers."""
        earlier = {t.request_id: t for t in partials}
        scoring: dict[str, asyncio.Task[None]] = {}
        requests = self.requests.group(row, n, uid, mode)
        tasks = [asyncio.ensure_future(self._generate(r, earlier.get(r.request_id), row, score, scoring, mode))
                 for r in requests]
        try:
            trajectories = await (self._first(tasks, [r.request_id for r in requests], keep) if keep
                                  else asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
        group = Group(uid=uid, row=row, trajectories=list(trajectories))
        for t in group.trajectories:
            if t.finish_reason == "aborted":
                t.reward_status = "aborted"
        finished = group.unaborted()
        if score and finished.trajectories:
            await self._scored(finished, scoring, mode)
        return group

    async def _generate(self, request: GenerationRequest, earlier: Trajectory | None, row: PromptRow,
                        score: bool, scoring: dict[str, asyncio.Task[None]], mode: Mode) -> Trajectory:
        traj = await (self._resume_or_sample(request, earlier) if self.episode is None
                      else self._run_episode(request, earlier, row))
        if score and self.score_each and traj.finish_reason != "aborted":  # while the others generate
            scoring[traj.request_id] = asyncio.create_task(self._score_one(row, traj, mode))
        return traj

    async def _first(self, tasks: Sequence[asyncio.Future[Trajectory]], ids: list[str], keep: int) -> list[Trajectory]:
        """The first `keep` responses to finish, then the others aborted (in request order)."""
        kept: list[Trajectory] = []
        cut: list[Trajectory] = []
        pending = set(tasks)
        while pending and len(kept) < keep:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for traj in (t.result() for t in tasks if t in done):
                (kept if traj.finish_reason != "aborted" and len(kept) < keep else cut).append(traj)
        if pending:
            await self.abort([rid for t, rid in zip(tasks, ids) if t in pending])
            cut += await asyncio.gather(*(t for t in tasks if t in pending))
        order = {rid: i for i, rid in enumerate(ids)}
        return kept + [t if t.finish_reason == "aborted" else dataclasses.replace(t, finish_reason="aborted")
                       for t in sorted(cut, key=lambda t: order[t.request_id])]

    async def _scored(self, group: Group, scoring: dict[str, asyncio.Task[None]], mode: Mode) -> None:
        if not self.score_each:
            await self.score([group], mode)
            return
        await asyncio.gather(*(scoring[t.request_id] for t in group.trajectories))
        for rid in scoring.keys() - {t.request_id for t in group.trajectories}:
            scoring[rid].cancel()  # a finisher cut by `keep`: its score is not needed

    async def _score_one(self, row: PromptRow, traj: Trajectory, mode: Mode) -> None:
        await self.score([Group(uid=traj.request_id, row=row, trajectories=[traj])], mode)

    async def score(self, groups: list[Group], mode: Mode = "train") -> list[Group]:
        """Rewards in the reward process pool (waited for on a thread), so the engine keeps stepping;
        `mode` "val": as validation scores (`RewardWorker.score`)."""
        start = clock.now()
        await asyncio.to_thread(self.reward.score_groups, groups, mode)
        end = clock.now()
        for t in (t for g in groups for t in g.trajectories):
            t.timings |= {"reward_start": start, "reward_end": end}
        return groups

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        """Stop these requests for good; their partial trajectories (ids not here are skipped).
        An episode's id stops the episode: its model turn in flight is aborted (that turn's
        partial, id `{episode}#{k}`, is what comes back here; the episode comes back in its group)."""
        ids = list(request_ids)
        self._stopped.update(i for i in ids if i in self._episodes)
        ids = [self._turn_of.get(i, i) for i in ids]  # an episode's model turn in flight
        self._interrupted.difference_update(ids)
        parked = [self._parked.pop(i) for i in ids if i in self._parked]
        return parked + await self.engine.abort(ids)

    async def _resume_or_sample(self, request: GenerationRequest, earlier: Trajectory | None) -> Trajectory:
        if earlier is None:
            return await self._timed_sample(request)
        if earlier.finish_reason != "aborted":
            return earlier
        self.partial_continuations += 1
        return await self._timed_sample(continuation(request, earlier))

    async def _run_episode(self, request: GenerationRequest, earlier: Trajectory | None, row: PromptRow) -> Trajectory:
        """One episode (a partial one continued on its current turn); `request` is its base:
        id, prompt and the mode's sampling parameters."""
        assert self.episode is not None
        if earlier is not None and earlier.finish_reason != "aborted":
            return earlier
        if earlier is not None:
            self.partial_continuations += 1
        eid = request.request_id
        keep = self.requests.cfg.multi_turn.keep_slot == "keep"
        client = EngineClient(request, functools.partial(self._turn, eid), self.reward.tokenizer,
                              max_response_tokens=self._episode_budget(request),
                              stopped=lambda: eid in self._stopped,
                              pin=getattr(self.engine, "pin", None) if keep else None,
                              unpin=getattr(self.engine, "unpin", None) if keep else None)
        self._episodes.add(eid)
        start = clock.now()
        try:
            traj = await self.episode(row, client, earlier)
        finally:
            self._episodes.discard(eid)
            self._stopped.discard(eid)
        traj.timings |= {"gen_start": start, "gen_end": clock.now()}
        return traj

    def _episode_budget(self, request: GenerationRequest) -> int:
        """Response tokens of an episode: data.max_response_length, and rollout.multi_turn.
        max_episode_tokens (prompt included) when set."""
        cap = self.requests.cfg.multi_turn.max_episode_tokens
        budget = self.requests.max_tokens
        return max(min(budget, cap - len(request.prompt_ids)) if cap else budget, 1)

    async def _turn(self, eid: str, request: GenerationRequest) -> Trajectory:
        self._turn_of[eid] = request.request_id
        try:
            return await self._sample(request)
        finally:
            self._turn_of.pop(eid, None)

    async def _timed_sample(self, request: GenerationRequest) -> Trajectory:
        start = clock.now()
        traj = await self._sample(request)
        traj.timings |= {"gen_start": start, "gen_end": clock.now()}
        return traj

    async def _sample(self, request: GenerationRequest) -> Trajectory:
        """One response, continued across interrupting syncs."""
        rid = request.request_id
        while True:
            self._live.add(rid)
            try:
                traj = await self.engine.generate(request)
            finally:
                self._live.discard(rid)
            if traj.finish_reason != "aborted" or rid not in self._interrupted:
                return traj
            self._interrupted.discard(rid)
            self._parked[rid] = traj
            await self._resumed.wait()
            if self._parked.pop(rid, None) is None:  # aborted for good while parked
                return traj
            request = continuation(request, traj)
            self.partial_continuations += 1

    # The rollout side's half of weight sync (asyncrl.roles.WeightSink).
    async def pause(self, mode: PauseMode = "keep") -> None:
        self._resumed.clear()
        if mode == "abort":  # marked first: the aborted generate calls resume as soon as we yield
            self._interrupted |= self._live
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()
        self._resumed.set()

    async def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        await self.engine.load_weights(as_pairs(named_tensors), version)

    async def receive_weights(self, group_name: str, meta: Sequence[WeightMeta], version: int,
                              bucket_mb: float) -> None:
        named = await asyncio.to_thread(recv_weights, group_name, meta, bucket_mb)
        await self.load_weights(named, version)

    async def weights_checksum(self) -> str:
        return await asyncio.to_thread(self.engine.weights_checksum)

    async def stats(self) -> dict[str, float]:
        s = self.engine.stats()
        return {"rollouter/running": s.running, "rollouter/waiting": s.waiting,
                "rollouter/preemptions": s.preemptions, "rollouter/tokens_per_s": s.tokens_per_s,
                "rollouter/prefill_tokens": s.prefill_tokens, "prefix_cache/queries": s.prefix_cache_queries,
                "prefix_cache/hit_tokens": s.prefix_cache_hit_tokens,
                "fully_async/partial/continuations": self.partial_continuations} | self.reward.metrics()

    def close(self) -> None:
        self.reward.close()
        closer = getattr(self.engine, "close", None)
        if callable(closer):
            closer()


def continuation(request: GenerationRequest, partial: Trajectory) -> GenerationRequest:
    """The request that continues `partial` from prompt + its tokens, keeping their log-probs
    and versions; a fresh seed so the continuation does not replay the first segment's draws."""
    seed = None if request.params.seed is None else request.params.seed + len(partial.response_ids)
    return dataclasses.replace(
        request, params=dataclasses.replace(request.params, seed=seed),
        prefix_ids=tuple(partial.response_ids), prefix_logprobs=tuple(partial.logprobs),
        prefix_versions=tuple(partial.versions))
