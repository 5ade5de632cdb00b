"""Static, bucketed decode (asyncrl.rollout.graphs), run eagerly on the CPU: what the CUDA graphs
replay. Padding rows up to a bucket and attending over the first L cached positions (L a power
of two >= the furthest position + 1, at least 128, at most the capacity) change nothing: greedy
and seeded samples, log-probs, abort + continue and weight loads match the dynamic engine, and
the (bucket, L) key follows the rows as they grow."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest
import torch

import asyncrl.rollout.runner as runner_module
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.graphs import attention_length, bucket_sizes
from asyncrl.rollout.memory import DeviceMemory
from tests.rollout.rollout_testlib import (
    EOS,
    prompt,
    request,
    settings_of,
    staggered_requests,
    tiny_model,
    wait_for_tokens,
)


def static_engine(model, **kw) -> TorchEngine:
    eng = TorchEngine(model, EOS, settings_of(cuda_graphs=True, **kw))
    assert eng._runner.bucketed_decode is not None and not eng._runner.bucketed_decode.capture  # eager on CPU
    return eng


def test_bucket_sizes():
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_sizes(1) == [1] and bucket_sizes(8) == [1, 2, 4, 8]


def test_attention_length():
    assert [attention_length(p, 2304) for p in (0, 5, 127, 128, 255, 256, 300, 2047, 2048, 2303)] == \
        [128, 128, 128, 256, 256, 512, 512, 2048, 2304, 2304]
    assert attention_length(10, 64) == 64  # the CPU's growing cache may be smaller than 128
    with pytest.raises(AssertionError):
        attention_length(64, 64)  # the position must lie inside the cache


def long_requests(temperature: float) -> list:
    """Three rows that decode past positions 128 and 256 (prompts 9..13, 280..300 tokens)."""
    return [request(f"long{i}", prompt(9 + 2 * i, seed=i), 300 - 10 * i, temperature, seed=i) for i in range(3)]


def lengths_first_seen(steps: Counter[tuple[int, int]]) -> list[int]:
    """The attention length of each (bucket, length) key, in the order the keys were first run."""
    return [length for _, length in steps]


@pytest.mark.parametrize("arch, temperature", [("llama", 0.0), ("qwen3", 0.9)])
def test_the_attention_length_key_follows_the_rows_and_equals_dynamic(arch, temperature):
    model = tiny_model(arch)
    reqs = long_requests(temperature)
    want = run_sync(TorchEngine(model, eos_token_id=EOS), reqs)
    eng = static_engine(model)
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    lengths = lengths_first_seen(eng._runner.bucketed_decode.steps)
    # the growing CPU cache starts at 64 positions, then 128 is the floor; 512 once past 256
    assert lengths == sorted(lengths) and set(lengths) == {64, 128, 256, 512}
    # the longest row (9 + 300 tokens) decodes 299 times, one step per token after the prefill's:
    # on the CPU each step's results are read before the next is planned (no extra step)
    assert not eng._runner.read_late
    assert sum(eng._runner.bucketed_decode.steps.values()) == 299
    eng.close()


def test_a_sized_cache_caps_the_attention_length_at_its_capacity(monkeypatch):
    """The GPU's fixed cache of max_model_len positions (300, not a power of two): past 256 the
    key is the capacity itself."""
    monkeypatch.setattr(runner_module, "device_memory", lambda device: DeviceMemory(free=2**40, total=2**40, held=0))
    model = tiny_model("qwen2")
    reqs = long_requests(0.8)
    want = run_sync(TorchEngine(model, eos_token_id=EOS), reqs)
    eng = static_engine(model, max_model_len=310, max_num_seqs=4)
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    keys = eng._runner.bucketed_decode.steps
    assert set(lengths_first_seen(keys)) == {128, 256, 310}
    assert {size for size, _ in keys} == {4, 2, 1}  # 3 rows pad to 4, then 2, then 1
    assert eng._runner.cache.capacity == 310
    eng.close()


@pytest.mark.parametrize("arch, temperature", [("llama", 0.0), ("qwen2", 0.7), ("qwen3", 1.0)])
def test_cuda_graphs_equals_dynamic(arch, temperature):
    model = tiny_model(arch)
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, seed=i))
            for i, r in enumerate(staggered_requests(7, temperature))]  # 7 rows: buckets 8, 4, 2, 1
    want = run_sync(TorchEngine(model, EOS, settings_of(max_num_seqs=40)), reqs)
    eng = static_engine(model, max_num_seqs=40)
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    assert {1, 2, 4, 8} <= {size for size, _ in eng._runner.bucketed_decode.steps}  # padded rows in every bucket but 1
    eng.close()


def test_cuda_graphs_keeps_abort_continue_and_weight_loads():
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
