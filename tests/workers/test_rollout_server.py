"""The rollout server's partial rollout: an interrupted response continues under new weights,
and the result equals the pieces (tokens, behaviour log-probs, per-token versions)."""

from __future__ import annotations

import asyncio
import copy

import torch

from asyncrl.config_schema import RewardConfig, RolloutConfig
from asyncrl.rollout import TorchEngine
from asyncrl.types import PromptRow
from asyncrl.workers.reward import RewardWorker
from asyncrl.workers.rollout import RolloutWorker
from asyncrl.workers.rollout_server import RolloutServer
from tests.training.helpers import tiny_lm

ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(5, 6, 7))


class NoTokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["1" for _ in ids]


def server(model) -> RolloutServer:
    engine = TorchEngine(copy.deepcopy(model), eos_token_id=0, kv_budget_tokens=4096, max_num_seqs=8)
    cfg = RolloutConfig(temperature=0.0, ignore_eos=True)
    return RolloutServer(RolloutWorker([engine], cfg, max_tokens=40, seed=0),
                         RewardWorker(NoTokenizer(), RewardConfig()))


async def interrupted_run(srv: RolloutServer, weights) -> tuple:
    task = asyncio.create_task(srv.generate_scored(ROW, 2, "g"))
    while srv.rollout.engines[0].stats().generated_tokens < 20:
        await asyncio.sleep(0.001)
    await srv.pause(interrupt=True)
    srv.load_weights(weights, version=1)
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
