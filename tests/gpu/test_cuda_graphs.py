"""CUDA-graph decode (skipped without a GPU): replays equal eager decoding, each bucket is
captured once while the cache keeps its buffers, and a replay after a weight load uses the new
weights (they are copied in place)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.rollout import TorchEngine, run_sync
from tests.rollout.rollout_testlib import EOS, staggered_requests, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def on_gpu(seed: int = 0) -> torch.nn.Module:
    return tiny_model("qwen2", seed=seed).cuda()


def test_graph_replays_equal_eager_decoding_and_are_captured_once_per_bucket():
    model = on_gpu()
    reqs = staggered_requests(7)
    eager = run_sync(TorchEngine(model, eos_token_id=EOS, device="cuda", static_decode=False), reqs)
    eng = TorchEngine(model, eos_token_id=EOS, device="cuda")  # graphs by default on CUDA
    graphs = eng._runner.graphs
    assert graphs is not None and graphs.capture
    first = run_sync(eng, reqs)
    assert [o.response_ids for o in first] == [o.response_ids for o in eager]
    captured = graphs.captures
    assert 1 <= captured <= len(graphs.sizes)
    again = run_sync(eng, reqs)  # same buckets, same cache: replays only
    assert [o.response_ids for o in again] == [o.response_ids for o in eager]
    assert graphs.captures == captured
    eng.close()


def test_a_replay_after_a_weight_load_uses_the_new_weights():
    model, other = on_gpu(0), on_gpu(1)
    reqs = staggered_requests(5)
    want = run_sync(TorchEngine(other, eos_token_id=EOS, device="cuda", static_decode=False), reqs)
    eng = TorchEngine(model, eos_token_id=EOS, device="cuda")
    before = run_sync(eng, reqs)
    captured = eng._runner.graphs.captures
    asyncio.run(eng.load_weights(other.state_dict().items(), version=1))
    after = run_sync(eng, reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in want]
    assert [o.response_ids for o in after] != [o.response_ids for o in before]
    assert eng._runner.graphs.captures == captured  # the same graphs, new weights
    eng.close()
