"""The engine's scheduler replayed on `bench/gpu_engine.py`'s request set (seed 0, the CUDA
defaults): its step counts are the GPU run's (issue 24; ../shared/gpu_results/2026-11-26), so a
change to admission shows here as a count, without a model or a GPU."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from asyncrl.rollout import run_sync
from asyncrl.rollout.settings import EngineSettings
from asyncrl.types import GenerationRequest
from bench.gpu_engine import CUDA_DEFAULTS, MODELS, workload
from bench.scheduler_replay import replay
from tests.rollout.rollout_testlib import engine, settings_of, staggered_requests, tiny_model


@pytest.fixture(scope="module")
def requests() -> list[GenerationRequest]:
    args = argparse.Namespace(**CUDA_DEFAULTS, sigma=1.0, seed=0)
    return workload(args, MODELS["qwen2-0.5b"]["vocab_size"])


def bench_settings(requests: list[GenerationRequest], batch: int, **fields: Any) -> EngineSettings:
    """What `bench/gpu_engine.py` gives the engine at max batch `batch` (and `fields`)."""
    longest = max(len(r.prompt_ids) + r.params.max_tokens for r in requests)
    return settings_of(max_num_seqs=batch, kv_budget_tokens=longest * batch, max_model_len=longest, **fields)


def test_the_request_set_is_the_benchmarks(requests: list[GenerationRequest]) -> None:
    assert len(requests) == 256
    assert sum(r.params.max_tokens for r in requests) == 99_245
    assert max(r.params.max_tokens for r in requests) == 2048


@pytest.mark.parametrize(("batch", "decode", "prefill", "moves", "graphs"),
                         [(64, 2895, 183, 234, 14), (256, 2052, 16, 220, 30)])
def test_admitting_at_one_free_slot_reproduces_the_gpu_run(requests: list[GenerationRequest], batch: int,
                                                           decode: int, prefill: int, moves: int,
                                                           graphs: int) -> None:
    counts = replay(requests, bench_settings(requests, batch, admit_min_free_slots=1))
    assert (counts.decode_steps, counts.prefill_steps, counts.move_steps, len(counts.graphs)) == \
        (decode, prefill, moves, graphs)
    assert counts.decode_rows + counts.prefill_rows == 99_245  # every token sampled once, no preemption


def test_waiting_for_eight_free_slots_cuts_the_prefill_steps(requests: list[GenerationRequest]) -> None:
    """Issue 24: at batch 64 with k = 8, at most 30 prefill steps (183 at k = 1), for 72 more decode
    steps (2.5%: rows wait up to 7 steps for a slot); every token is still sampled once."""
    counts = replay(requests, bench_settings(requests, 64, admit_min_free_slots=8))
    assert counts.prefill_steps <= 30
    assert (counts.prefill_steps, counts.decode_steps) == (28, 2967)
    assert counts.decode_rows + counts.prefill_rows == 99_245


@pytest.mark.parametrize("batch", [64, 256])
def test_the_cuda_default(requests: list[GenerationRequest], batch: int) -> None:
    settings = bench_settings(requests, batch, device="cuda")  # admit_min_free_slots 0: max_num_seqs / 8
    counts = replay(requests, settings)
    print(f"batch {batch}, CUDA default k = {settings.admit_min_free_slots}: {counts.prefill_steps} prefill steps, "
          f"{counts.decode_steps} decode steps")
    assert counts.prefill_steps <= 30



def test_the_engine_admits_by_its_settings_and_steps_as_the_replay_does() -> None:
    """TorchEngine carries `admit_min_free_slots` to its scheduler: its steps are the replay's,
    fewer of them prefill at k = 4 than at 1, and k changes no greedy response (rows are
    independent)."""
    model, reqs = tiny_model("llama"), staggered_requests(10)
    responses, prefill_steps = [], []
    for k in (1, 4):
        eng = engine(model, max_num_seqs=4, admit_min_free_slots=k)
        responses.append([o.response_ids for o in run_sync(eng, reqs)])
        eng.close()
        counts = replay(reqs, settings_of(max_num_seqs=4, admit_min_free_slots=k),
                        one_step_late=eng._runner.read_late)
        assert eng._scheduler.step_counts == {"steps": counts.steps, "decode": counts.decode_steps,
                                              "prefill": counts.prefill_steps, "moves": counts.move_steps}
        prefill_steps.append(counts.prefill_steps)
    assert prefill_steps == [7, 3]
    assert responses[0] == responses[1]
