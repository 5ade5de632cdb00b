"""CUDA-graph decode (skipped without a GPU): replays equal eager decoding, each (bucket,
attention length) key is captured once while the cache keeps its buffers, rows that grow move
to longer keys, a replay after a weight load uses the new weights (they are copied in place),
and capturing while another thread runs CUDA work (a colocated trainer) fails neither side."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from asyncrl.rollout import TorchEngine, run_sync
from tests.rollout.rollout_testlib import EOS, prompt, request, settings_of, staggered_requests, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def on_gpu(seed: int = 0) -> torch.nn.Module:
    return tiny_model("qwen2", seed=seed).cuda()


def long_requests() -> list:
    """Three greedy rows that decode past positions 128 and 256 (at most 309 tokens)."""
    return [request(f"long{i}", prompt(9 + 2 * i, seed=i), 300 - 10 * i) for i in range(3)]


def test_graph_replays_equal_eager_decoding_and_are_captured_once_per_bucket():
    model = on_gpu()
    reqs = staggered_requests(7)
    eager = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", cuda_graphs=False)), reqs)
    eng = TorchEngine(model, EOS, settings_of(device="cuda"))  # graphs by default on CUDA
    graphs = eng._runner.bucketed_decode
    assert graphs is not None and graphs.capture
    first = run_sync(eng, reqs)
    assert [o.response_ids for o in first] == [o.response_ids for o in eager]
    captured = graphs.captures
    assert 1 <= captured == len(set(graphs.steps))  # short rows: one length key (128)
    again = run_sync(eng, reqs)  # same keys, same cache: replays only
    assert [o.response_ids for o in again] == [o.response_ids for o in eager]
    assert graphs.captures == captured
    eng.close()


def test_a_replay_after_a_weight_load_uses_the_new_weights():
    model, other = on_gpu(0), on_gpu(1)
    reqs = staggered_requests(5)
    want = run_sync(TorchEngine(other, EOS, settings_of(device="cuda", cuda_graphs=False)), reqs)
    eng = TorchEngine(model, EOS, settings_of(device="cuda"))
    before = run_sync(eng, reqs)
    captured = eng._runner.bucketed_decode.captures
    asyncio.run(eng.load_weights(other.state_dict().items(), version=1))
    after = run_sync(eng, reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in want]
    assert [o.response_ids for o in after] != [o.response_ids for o in before]
    assert eng._runner.bucketed_decode.captures == captured  # the same graphs, new weights
    eng.close()


@pytest.mark.parametrize(("attention", "lengths"), [("triton", {0}), ("matmul", {128, 256, 320})])
def test_replays_across_graph_keys_equal_eager_decoding(attention, lengths):
    """CUDA's default split-KV kernel reads each row's length from the inputs: one key per bucket,
    its length part 0; the matmul path keys by attention length too, capped at the capacity, 320."""
    model = on_gpu()
    reqs = long_requests()
    eager = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", cuda_graphs=False,
                                                            decode_attention=attention)), reqs)
    eng = TorchEngine(model, EOS, settings_of(device="cuda", max_model_len=320, max_num_seqs=4,
                                                 decode_attention=attention))
    graphs = eng._runner.bucketed_decode
    first = run_sync(eng, reqs)
    assert [o.response_ids for o in first] == [o.response_ids for o in eager]
    for g, w in zip(first, eager):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-4)
    keys = set(graphs.steps)
    assert {length for _, length in keys} == lengths
    assert graphs.captures == len(keys)  # each key once, lazily
    again = run_sync(eng, reqs)
    assert [o.response_ids for o in again] == [o.response_ids for o in eager]
    assert graphs.captures == len(keys)
    eng.close()


def test_capture_while_another_thread_runs_cuda_work():
    """What a colocated trainer does on its own thread while the engine's step thread captures:
    kernels, fresh allocations, host reads. Thread-local capture lets both proceed."""
    model = on_gpu()
    reqs = long_requests()
    eager = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", cuda_graphs=False)), reqs)
    stop, errors, steps = threading.Event(), [], [0]

    def trainer() -> None:
        x = torch.randn(256, 256, device="cuda")
        try:
            while not stop.is_set():
                grown = torch.empty(2**20 + 4096 * (steps[0] % 512), device="cuda")  # allocations of varying size
                (x @ x + grown[:1]).sum().item()  # a host read waits for the device
                steps[0] += 1
        except Exception as error:  # reported below; the thread must not die silently
            errors.append(error)

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        eng = TorchEngine(model, EOS, settings_of(device="cuda", max_model_len=320, max_num_seqs=4))
        got = run_sync(eng, reqs)
    finally:
        stop.set()
        thread.join()
    assert not errors and steps[0] > 0
    assert [o.response_ids for o in got] == [o.response_ids for o in eager]
    assert eng._runner.bucketed_decode.captures >= 3
    eng.close()
