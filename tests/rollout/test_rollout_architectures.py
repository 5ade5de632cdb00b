"""Each architecture through TorchEngine equals HF: greedy outputs equal `generate`, sampled
log-probs equal teacher-forced ones; which forward runs a model, and that the engine says so once."""

from __future__ import annotations

import logging

import pytest
import torch

from asyncrl.rollout import run_sync
from asyncrl.rollout.generic import GenericForward, build_forward
from asyncrl.types import GenerationRequest
from tests.rollout.rollout_testlib import (
    FAST_ARCHS,
    GENERIC_ARCHS,
    engine,
    staggered_requests,
    teacher_forced_logprobs,
    tiny_config,
    tiny_model,
)


def hf_greedy(model: torch.nn.Module, req: GenerationRequest) -> list[int]:
    """HF generate, greedy, exactly max_tokens new tokens (no EOS in play)."""
    model.generation_config.eos_token_id = None
    n, ids = req.params.max_tokens, torch.tensor([req.prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("arch", FAST_ARCHS + GENERIC_ARCHS)
def test_greedy_outputs_equal_hf_generate(arch: str) -> None:
    model = tiny_model(arch, seed=3)
    reqs = staggered_requests(6)
    eng = engine(model, max_num_seqs=4)  # 6 requests, 4 slots: admissions while others decode
    outs = run_sync(eng, reqs)
    eng.close()
    for req, out in zip(reqs, outs, strict=True):
        assert out.response_ids == hf_greedy(model, req), (arch, req.request_id)


@pytest.mark.parametrize("arch", FAST_ARCHS + GENERIC_ARCHS)
def test_sampled_logprobs_equal_teacher_forced_hf_logprobs(arch: str) -> None:
    model = tiny_model(arch, seed=4)
    eng = engine(model, seed=0, max_num_seqs=4)
    outs = run_sync(eng, staggered_requests(6, temperature=0.7))
    eng.close()
    for out in outs:
        expected = teacher_forced_logprobs(model, out.prompt_ids, out.response_ids, 0.7)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, rtol=0, atol=1e-5)
    assert len({tuple(o.response_ids) for o in outs}) == len(outs)


@pytest.mark.parametrize(("arch", "batched"), [("gpt2", True), ("gpt_neox", True), ("opt", True),
                                               ("gemma2", False)])
def test_generic_path_batches_unless_the_cache_forbids_it(arch: str, batched: bool) -> None:
    forward, problem = build_forward(tiny_model(arch))
    assert isinstance(forward, GenericForward) and problem is not None and arch in problem
    assert forward.batched is batched
    if not batched:
        assert "DynamicSlidingWindowLayer" in str(forward.per_row_reason)


def test_length_dependent_rope_leaves_the_fast_path_and_still_equals_hf() -> None:
    config = tiny_config("llama")
    config.rope_parameters = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}
    config.max_position_embeddings = 8  # prompts + outputs run past it: the scaling kicks in
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config).eval()
    forward, problem = build_forward(model)
    assert isinstance(forward, GenericForward) and not forward.batched and "dynamic" in str(problem)
    reqs = staggered_requests(3)
    outs = run_sync(engine(model), reqs)
    assert [o.response_ids for o in outs] == [hf_greedy(model, r) for r in reqs]


def test_engine_says_once_when_a_model_runs_on_the_generic_path(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="asyncrl.rollout"):
        eng = engine(tiny_model("gpt2"))
        run_sync(eng, staggered_requests(3))
        run_sync(eng, staggered_requests(2))
        eng.close()
        engine(tiny_model("qwen3")).close()
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncrl.rollout"]
    assert len(lines) == 1 and "'gpt2'" in lines[0] and "generic" in lines[0], lines


def test_forced_generic_path_equals_the_fast_path_on_a_fast_model() -> None:
    model = tiny_model("qwen3", seed=5)
    reqs = staggered_requests(5, temperature=1.0)
    fast = run_sync(engine(model, seed=1), reqs)
    generic_engine = engine(model, seed=1, forward="generic")
    assert isinstance(generic_engine._runner.forward, GenericForward)
    generic = run_sync(generic_engine, reqs)
    for a, b in zip(fast, generic, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
