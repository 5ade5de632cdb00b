"""Device sampling and the one-step-late read on CUDA (skipped without a GPU): a static engine's
steps never wait for the GPU but for each step's one results copy, read a step late (the CPU
twin, tests/rollout/test_rollout_host_reads.py, counts the reads); a seeded request samples the
same tokens alone and inside other batches, replayed from the decode graphs, where the sampling
runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout import runner as runner_module
from asyncrl.types import GenerationRequest, SamplingParams, Trajectory
from tests.rollout.rollout_testlib import (
    EOS,
    mixed_requests,
    prompt,
    settings_of,
    staggered_requests,
    tiny_model,
    wait_for_tokens,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def static_engine(model: torch.nn.Module, **settings: Any) -> TorchEngine:
    return TorchEngine(model, EOS, settings_of(device="cuda", max_num_seqs=8, seed=0, **settings))


def test_a_static_engine_waits_for_the_gpu_only_to_read_each_step_a_step_late(monkeypatch):
    eng = static_engine(tiny_model("qwen2").cuda())
    assert eng._runner.bucketed_decode is not None and eng._runner.bucketed_decode.capture
    warm = run_sync(eng, mixed_requests(9, 12, 5))  # captures every graph key this workload needs
    captured = eng._runner.bucketed_decode.captures
    reads = [0]
    read = runner_module._Results.read

    def allowed(launched: Any) -> Any:
        reads[0] += 1
        torch.cuda.set_sync_debug_mode(0)
        try:
            return read(launched)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(runner_module._Results, "read", staticmethod(allowed))
    launched = [0]
    launch = runner_module.StepRunner._launch
    monkeypatch.setattr(runner_module.StepRunner, "_launch",
                        lambda self, plan: launched.__setitem__(0, launched[0] + 1) or launch(self, plan))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = run_sync(eng, mixed_requests(9, 12, 5))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    eng.close()
    assert eng._runner.bucketed_decode.captures == captured  # replays only
    assert reads[0] == launched[0] > 20
    # counter-based sampling: the same requests give the same tokens in a second run
    assert [o.response_ids for o in again] == [o.response_ids for o in warm]


def test_a_seeded_request_samples_the_same_tokens_alone_and_in_other_batches_on_cuda():
    model = tiny_model("llama").cuda()
    seeded = GenerationRequest("seeded", prompt(7, seed=9),
                               SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True))
    alone = run_sync(static_engine(model), [seeded])[0]

    async def crowded(others: list[GenerationRequest], after: int) -> Trajectory:
        eng = static_engine(model, seed=5)
        tasks = [asyncio.create_task(eng.generate(r)) for r in others]
        await wait_for_tokens(eng, after)  # join mid-run, in another slot and graph bucket
        out = await eng.generate(seeded)
        await asyncio.gather(*tasks)
        await eng.aclose()
        return out

    for others, after in ((staggered_requests(5, 1.0), 6), (mixed_requests(9, 12, 5), 20)):
        out = asyncio.run(crowded(others, after))
        assert out.response_ids == alone.response_ids
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-4)
