"""The engine's correctness on CUDA (skipped without a GPU): the CPU tests' claims, on the device.
Greedy output equals HF `generate`; behaviour log-probs equal teacher-forced ones (float32
tightly, bf16 within bf16 noise); abort + continue equals an uninterrupted response; after a
weight load the engine follows the new weights."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from asyncrl.rollout import run_sync
from tests.rollout.rollout_testlib import EOS, engine, prompt, request, staggered_requests, tiny_model, wait_for_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")


def on_gpu(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return tiny_model(arch, seed=seed).to(device=CUDA, dtype=dtype)


def teacher_forced(model: torch.nn.Module, prompt_ids, response_ids, temperature: float) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=CUDA)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response_ids, device=CUDA)[:, None]).squeeze(1).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_hf_generate_on_cuda(dtype):
    model = on_gpu(dtype=dtype)
    prompt_ids = prompt(6, seed=1)
    ref = model.generate(torch.tensor([prompt_ids], device=CUDA), max_new_tokens=12, min_new_tokens=12,
                         do_sample=False, pad_token_id=EOS)[0, 6:].tolist()
    eng = engine(model, device="cuda")
    assert run_sync(eng, [request("a", prompt_ids, 12)])[0].response_ids == ref
    eng.close()


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_behaviour_log_probs_equal_teacher_forced_on_cuda(dtype, atol):
    model = on_gpu("qwen2", dtype=dtype)
    eng = engine(model, device="cuda", seed=0)
    outs = run_sync(eng, staggered_requests(6, temperature=0.7))
    for out in outs:
        expected = teacher_forced(model, out.prompt_ids, out.response_ids, 0.7)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, rtol=0, atol=atol)
    assert len({tuple(o.response_ids) for o in outs}) == len(outs)
    eng.close()


def test_abort_and_continue_equals_an_uninterrupted_response_on_cuda():
    model = on_gpu()
    reqs = [request(f"r{i}", prompt(5 + i, seed=i), 30) for i in range(4)]
    refs = run_sync(engine(model, device="cuda"), reqs)

    async def main():
        eng = engine(model, device="cuda")
        tasks = [asyncio.create_task(eng.generate(r)) for r in reqs]
        await wait_for_tokens(eng, 20)
        partials = await eng.abort(["r1", "r3"])
        await asyncio.gather(*tasks)
        continued = []
        for part in partials:
            req = next(r for r in reqs if r.request_id == part.request_id)
            continued.append(await eng.generate(dataclasses.replace(
                req, prefix_ids=tuple(part.response_ids), prefix_logprobs=tuple(part.logprobs),
                prefix_versions=tuple(part.versions))))
        await eng.aclose()
        return partials, continued

    partials, continued = asyncio.run(main())
    for part, cont, ref in zip(partials, continued, [refs[1], refs[3]]):
        assert 0 < len(part.response_ids) < 30
        assert cont.response_ids == ref.response_ids


def test_a_weight_load_changes_what_the_engine_generates_on_cuda():
    model, other = on_gpu(seed=0), on_gpu(seed=1)
    reqs = staggered_requests(3)
    ref_other = run_sync(engine(other, device="cuda"), reqs)
    eng = engine(model, device="cuda")
    before = run_sync(eng, reqs)
    asyncio.run(eng.load_weights(other.state_dict().items(), version=2))
    after = run_sync(eng, reqs)
    assert [o.response_ids for o in after] == [o.response_ids for o in ref_other]
    assert [o.response_ids for o in after] != [o.response_ids for o in before]
    assert all(o.versions == [2] * len(o.response_ids) for o in after)
    eng.close()
