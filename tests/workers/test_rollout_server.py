"""The rollout server's partial rollout: an interrupted response continues under new weights,
and the result equals the pieces (tokens, behaviour log-probs, per-token versions)."""

from __future__ import annotations

import asyncio
import copy

import torch

from asyncrl.config.schema import RewardConfig, RolloutConfig
from asyncrl.rollout import TorchEngine, engine_settings
from asyncrl.types import PromptRow
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RequestBuilder
from asyncrl.workers.rollout_server import RolloutServer
from tests.training.helpers import tiny_lm

ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(5, 6, 7))


class NoTokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["1" for _ in ids]


def server(model) -> RolloutServer:
    engine = TorchEngine(copy.deepcopy(model), 0, engine_settings(RolloutConfig(kv_budget_tokens=4096, max_num_seqs=8)))
    cfg = RolloutConfig(temperature=0.0, ignore_eos=True)
    return RolloutServer(engine, RequestBuilder(cfg, max_tokens=40, seed=0),
                         RewardWorker(NoTokenizer(), RewardConfig()))


async def wait_for_tokens(srv: RolloutServer, n: int) -> None:
    while srv.engine.stats().generated_tokens < n:
        await asyncio.sleep(0.001)


async def interrupted_run(srv: RolloutServer, weights) -> tuple:
    task = asyncio.create_task(srv.generate_scored(ROW, 2, "g"))
    await wait_for_tokens(srv, 20)
    await srv.pause("abort")
    await srv.load_weights(weights, version=1)
    await srv.resume()
    return await task


def test_interrupted_response_equals_its_pieces():
    model = tiny_lm()
    plain = asyncio.run(server(model).generate_scored(ROW, 2, "g"))
    srv = server(model)
    same_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    group = asyncio.run(interrupted_run(srv, same_weights))
    assert srv.partial_continuations == 2
    for a, b in zip(plain.trajectories, group.trajectories):
        assert b.response_ids == a.response_ids and len(b.response_ids) == 40
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=1e-5, atol=1e-5)
        assert b.versions[0] == 0 and b.versions[-1] == 1 and b.num_segments == 2
        assert b.versions == sorted(b.versions) and b.finish_reason == "length"
        assert b.reward == 1.0


def test_abort_stops_selected_responses_and_returns_their_partials():
    model = tiny_lm()
    plain = asyncio.run(server(model).generate_scored(ROW, 4, "g"))

    async def main():
        srv = server(model)
        task = asyncio.create_task(srv.generate_scored(ROW, 4, "g"))
        await wait_for_tokens(srv, 20)
        partials = await srv.abort(["g/1", "g/3", "other/0"])
        return partials, await task

    partials, group = asyncio.run(main())
    assert sorted(p.request_id for p in partials) == ["g/1", "g/3"]
    for i, t in enumerate(group.trajectories):
        ref = plain.trajectories[i]
        if i in (1, 3):
            assert t.finish_reason == "aborted" and t.reward_status == "aborted" and t.reward == 0.0
            assert 0 < len(t.response_ids) < 40 and len(t.logprobs) == len(t.versions) == len(t.response_ids)
            assert t.response_ids == ref.response_ids[: len(t.response_ids)]
            torch.testing.assert_close(torch.tensor(t.logprobs), torch.tensor(ref.logprobs[: len(t.logprobs)]),
                                       rtol=1e-5, atol=1e-5)
        else:
            assert t.response_ids == ref.response_ids and t.reward == 1.0


def test_abort_while_interrupted_for_a_sync_is_never_continued():
    model = tiny_lm()

    async def main():
        srv = server(model)
        task = asyncio.create_task(srv.generate_scored(ROW, 2, "g"))
        await wait_for_tokens(srv, 20)
        await srv.pause("abort")
        partials = await srv.abort(["g/0"])
        await srv.resume()
        return srv, partials, await task

    srv, partials, group = asyncio.run(main())
    assert [p.request_id for p in partials] == ["g/0"] and partials[0].finish_reason == "aborted"
    first, second = group.trajectories
    assert first.finish_reason == "aborted" and first.response_ids == partials[0].response_ids
    assert second.finish_reason == "length" and len(second.response_ids) == 40
    assert srv.partial_continuations == 1  # only g/1 continued


def test_a_stopped_runs_partial_responses_continue_in_a_new_server():
    model = tiny_lm()
    plain = asyncio.run(server(model).generate_scored(ROW, 4, "g"))

    async def stopped() -> list:
        srv = server(model)
        task = asyncio.create_task(srv.generate_scored(ROW, 4, "g"))
        await wait_for_tokens(srv, 20)
        await srv.abort(["g/1", "g/3"])
        return (await task).trajectories

    partials = asyncio.run(stopped())  # what a checkpoint holds: g/0, g/2 finished; g/1, g/3 cut short
    resumed = server(model)  # a new process, same weights
    group = asyncio.run(resumed.generate_scored(ROW, 4, "g", partials=partials))
    assert resumed.partial_continuations == 2
    for t, before, ref in zip(group.trajectories, partials, plain.trajectories):
        assert t.response_ids == ref.response_ids and t.finish_reason == "length" and t.reward == 1.0
        assert list(t.response_ids[: len(before.response_ids)]) == list(before.response_ids)
        torch.testing.assert_close(torch.tensor(t.logprobs), torch.tensor(ref.logprobs), rtol=1e-5, atol=1e-5)
    assert group.trajectories[0] is partials[0]  # a finished response is kept, not generated again
