"""The packed prefill on CUDA (skipped without a GPU): in bf16 the engine prefills through the
varlen kernel, captured per (token bucket, row bucket) and replayed, and its greedy tokens equal
HF `generate`'s on a fixed prompt set, admissions while other rows decode included."""

from __future__ import annotations

import pytest
import torch

from asyncrl.rollout import run_sync
from asyncrl.training import attention_kernels as kernels
from tests.rollout.rollout_testlib import EOS, engine, prompt, request, tiny_model
from tests.tolerances import eps_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
BF16 = torch.bfloat16
PROMPTS = [prompt(n, seed=n) for n in (6, 13, 3, 21, 9)]
NEW_TOKENS = 12


def hf_greedy(model: torch.nn.Module, prompt_ids: tuple[int, ...]) -> tuple[list[int], list[bool]]:
    """HF's greedy tokens, and for each whether its top-2 logit gap is clear of bf16 rounding:
    two bf16 computations of a logit differ by a few roundings of its size (the head's output
    and the normed hidden state's, each rounded once per computation), so a gap under
    8 eps x max|logit| is a tie either computation may break its own way."""
    ids = torch.tensor([prompt_ids], device=CUDA)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                         min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=EOS,
                         output_logits=True, return_dict_in_generate=True)
    logits = torch.stack(out.logits)[:, 0].float()  # (tokens, V)
    top = logits.topk(2).values
    clear = (top[:, 0] - top[:, 1]) > 8 * eps_of(BF16) * logits.abs().amax(dim=-1)
    return out.sequences[0, len(prompt_ids):].tolist(), clear.tolist()


def test_bf16_prefill_runs_varlen_captured_and_greedy_equals_hf() -> None:
    if kernels.varlen_kernel() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen (2.10+)")
    model = tiny_model("llama", seed=0).to(device=CUDA, dtype=BF16)
    model.generation_config.eos_token_id = None
    reqs = [request(f"p{i}", p, NEW_TOKENS) for i, p in enumerate(PROMPTS)]
    eng = engine(model, device="cuda", max_num_seqs=3)  # 5 prompts, 3 slots: admissions mid-decode
    runner = eng._runner
    assert runner.prefill_path == "varlen" and runner.bucketed_prefill is not None
    first = run_sync(eng, reqs)
    graphs = runner.bucketed_prefill
    assert set(runner.prefills) == {"varlen"} and graphs.eager == 0
    assert graphs.captures == len(set(graphs.steps)) >= 2  # 3 prompts first, then 1 at a time
    compared = 0
    for out, p in zip(first, PROMPTS, strict=True):
        want, clear = hf_greedy(model, p)
        for got_token, want_token, decided in zip(out.response_ids, want, clear, strict=True):
            if not decided:  # a near-tie: what follows is no longer a comparison of the engine
                break
            assert got_token == want_token, (p, out.response_ids, want)
            compared += 1
    assert compared >= len(PROMPTS) * NEW_TOKENS // 2  # the gate left most tokens compared
    captured = graphs.captures
    again = run_sync(eng, reqs)  # the same keys: replays only, the same tokens
    assert graphs.captures == captured
    assert [o.response_ids for o in again] == [o.response_ids for o in first]
    eng.close()
