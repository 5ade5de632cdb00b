"""`generate_scored(keep=k)` (tail batching) and streamed scoring on the real rollout host."""

from __future__ import annotations

import asyncio

from asyncrl.config.schema import RewardConfig, RolloutConfig
from asyncrl.types import PromptRow
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder
from asyncrl.workers.rollout_server import RolloutServer
from tests.workers.fakes import ScriptedEngine

ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(5, 6, 7))
LENGTHS = [30, 5, 50, 10, 20]  # response i of every group


class OnesTokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["1" for _ in ids]


def host(score_each: bool = False) -> tuple[RolloutServer, ScriptedEngine]:
    engine = ScriptedEngine(lambda rid: LENGTHS[int(rid.rpartition("/")[2])])
    reward = RewardWorker(OnesTokenizer(), RewardConfig(num_workers=1))
    return RolloutServer(engine, RequestBuilder(RolloutConfig(), max_tokens=64, seed=0), reward, score_each), engine


def test_keep_returns_the_first_finishers_scored_and_aborts_the_rest():
    srv, engine = host()
    try:
        group = asyncio.run(srv.generate_scored(ROW, 5, "g", keep=3))
    finally:
        srv.close()
    kept = group.unaborted().trajectories
    assert [t.request_id for t in kept] == ["g/1", "g/3", "g/4"]  # lengths 5, 10, 20
    assert [t.reward for t in kept] == [1.0, 1.0, 1.0]
    cut = group.trajectories[3:]
    assert [t.request_id for t in cut] == ["g/0", "g/2"] and sorted(engine.aborted) == ["g/0", "g/2"]
    assert all(t.finish_reason == "aborted" and t.reward_status == "aborted" for t in cut)
    assert all(0 < len(t.response_ids) < LENGTHS[int(t.request_id[-1])] for t in cut)


def test_an_outside_abort_ends_a_keep_group_early():
    srv, _ = host()

    async def run():
        task = asyncio.create_task(srv.generate_scored(ROW, 5, "g", keep=4))
        await asyncio.sleep(15 * 0.002)
        await srv.abort([f"g/{i}" for i in range(5)])
        return await task

    try:
        group = asyncio.run(run())
    finally:
        srv.close()
    assert len(group.trajectories) == 5
    assert len(group.unaborted().trajectories) < 4


def test_streamed_scores_start_before_the_group_ends():
    srv, _ = host(score_each=True)
    try:
        group = asyncio.run(srv.generate_scored(ROW, 5, "g"))
    finally:
        srv.close()
    assert [t.reward for t in group.trajectories] == [1.0] * 5
    last_gen = max(t.timings["gen_end"] for t in group.trajectories)
    first = min(group.trajectories, key=lambda t: t.timings["gen_end"])
    assert first.timings["reward_start"] < last_gen  # scored while the 50-token response still ran
