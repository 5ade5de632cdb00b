"""Static, bucketed decode (asyncrl.rollout.graphs), run eagerly on the CPU: what the CUDA graphs
replay. Padding rows up to a bucket and attending over the whole static cache change nothing:
greedy and seeded samples, log-probs, abort + continue and weight loads match the dynamic engine."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.graphs import bucket_sizes
from tests.rollout.rollout_testlib import EOS, prompt, request, staggered_requests, tiny_model, wait_for_tokens


def static_engine(model, **kw) -> TorchEngine:
    eng = TorchEngine(model, eos_token_id=EOS, static_decode=True, **kw)
    assert eng._runner.graphs is not None and not eng._runner.graphs.capture  # eager on CPU
    return eng


def test_bucket_sizes():
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_sizes(1) == [1] and bucket_sizes(8) == [1, 2, 4, 8]


@pytest.mark.parametrize("arch, temperature", [("llama", 0.0), ("qwen2", 0.7), ("qwen3", 1.0)])
def test_static_decode_equals_dynamic(arch, temperature):
    model = tiny_model(arch)
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, seed=i))
            for i, r in enumerate(staggered_requests(7, temperature))]  # 7 rows: buckets 8, 4, 2, 1
    want = run_sync(TorchEngine(model, eos_token_id=EOS, max_num_seqs=40), reqs)
    eng = static_engine(model, max_num_seqs=40)
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    assert {1, 2, 4, 8} <= set(eng._runner.graphs._buckets)  # padded rows in every bucket but 1
    eng.close()


def test_static_decode_keeps_abort_continue_and_weight_loads():
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    reqs = [request(f"r{i}", prompt(5 + i, seed=i), 30) for i in range(3)]
    refs = run_sync(TorchEngine(model, eos_token_id=EOS), reqs)

    async def interrupted():
        eng = static_engine(model)
        tasks = [asyncio.create_task(eng.generate(r)) for r in reqs]
        await wait_for_tokens(eng, 12)
        (part,) = await eng.abort(["r1"])
        await asyncio.gather(*tasks)
        cont = await eng.generate(dataclasses.replace(
            reqs[1], prefix_ids=tuple(part.response_ids), prefix_logprobs=tuple(part.logprobs),
            prefix_versions=tuple(part.versions)))
        await eng.aclose()
        return part, cont

    part, cont = asyncio.run(interrupted())
    assert 0 < len(part.response_ids) < 30 and cont.response_ids == refs[1].response_ids
    eng = static_engine(model)
    run_sync(eng, reqs)
    asyncio.run(eng.load_weights(other.state_dict().items(), version=1))
    after = run_sync(eng, reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in run_sync(TorchEngine(other, eos_token_id=EOS),
                                                                                  reqs)]
    eng.close()
