"""The packed prefill: prompts concatenated without padding give the padded prefill's logits and
cache contents within float32 rounding, through the varlen call where it runs (a CPU stand-in for
the kernel here), bucketed with a dummy tail that writes nothing any row reads; the engine takes
the path `prefill_path` picks and still decodes HF's greedy tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
import torch

from asyncrl.config.schema import RolloutConfig
from asyncrl.rollout import run_sync
from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.graphs import BucketedPrefill, prefill_token_buckets
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.prefill import PackedPrompts, PrefillPath, causal_attention, pack_prompts, prefill_path
from asyncrl.rollout.settings import engine_settings
from asyncrl.training import attention_kernels as kernels
from tests.rollout.rollout_testlib import FAST_ARCHS, engine, prompt, request, staggered_requests, tiny_model
from tests.rollout.test_rollout_architectures import hf_greedy
from tests.tolerances import sum_error

F32 = torch.float32
CONTEXTS = ((5, 11, 2), (1, 9))  # prompt lengths of two prefills


def chain_terms(model: torch.nn.Module, layers: int, longest: int) -> int:
    """Terms of the sums on the way from the embedding through `layers` decoder layers, each a
    place where two summation orders round differently: q/k/v (hidden), scores (head_dim), the
    weighted values (the longest row), o (heads x head_dim), gate/up (hidden), down
    (intermediate). `sum_error` over them all bounds what reaches the output, each upstream
    relative error carried at most once (RMSNorm renormalises; `sum_error`'s n eps is the worst
    case, as tests/tolerances.py argues, which covers partly cancelling terms)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_layer = c.hidden_size + head_dim + longest + c.num_attention_heads * head_dim + c.hidden_size \
        + c.intermediate_size
    return layers * per_layer


def padded(fwd: BatchedForward, cache: SlotKVCache, contexts: Sequence[Sequence[int]], first_slot: int) -> torch.Tensor:
    lengths = torch.tensor([len(c) for c in contexts])
    ids = torch.zeros(len(contexts), int(lengths.max()), dtype=torch.int64)
    for row, ctx in enumerate(contexts):
        ids[row, : len(ctx)] = torch.tensor(ctx)
    return fwd.prefill(cache, ids, lengths, first_slot)


def packed(fwd: BatchedForward, cache: SlotKVCache, contexts: Sequence[Sequence[int]], first_slot: int,
           path: PrefillPath = "rows", **bucket: int) -> torch.Tensor:
    flat, lengths = pack_prompts(contexts, first_slot, capacity=cache.capacity if bucket else None, **bucket)
    tokens, rows = bucket.get("tokens", sum(lengths)), bucket.get("rows", len(contexts))
    return fwd.prefill_packed(cache, PackedPrompts.view(flat, tokens, rows, lengths, max(lengths)), path)


def two_caches(fwd: BatchedForward) -> tuple[SlotKVCache, SlotKVCache]:
    """Two caches of 8 slots, both filled with the same stale contents."""
    caches = fwd.new_cache(8, "cpu"), fwd.new_cache(8, "cpu")
    for cache in caches:
        cache.reserve(8, 32)
        generator = torch.Generator().manual_seed(1)
        for buffer in (*cache.keys, *cache.values):
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return caches


def stacked(cache: SlotKVCache) -> torch.Tensor:
    """(2, layers, slots, heads, positions, head_dim): every buffer, whatever the cache's layout."""
    return torch.stack([torch.stack(cache.keys), torch.stack(cache.values)])


def test_pack_prompts_lays_out_the_worked_example() -> None:
    flat, lengths = pack_prompts([(5, 6, 7), (8,)], 2, tokens=6, rows=3, capacity=32)
    assert lengths == (3, 3, 0)
    assert flat[:18].view(3, 6).tolist() == [[5, 6, 7, 8, 0, 0], [0, 1, 2, 0, 1, 2], [2, 2, 2, 3, 3, 3]]
    assert flat[18:].tolist() == [0, 3, 6, 6, 2, 3, 0]  # bounds, then each row's last token
    tail_past_capacity = pack_prompts([(5, 6, 7)], 0, tokens=6, rows=1, capacity=4)[0]
    assert tail_past_capacity[6:12].tolist() == [0, 1, 2, 3, 3, 3]  # the tail stays inside the slot


def test_token_buckets_are_powers_of_two_up_to_the_prefill_budget() -> None:
    assert prefill_token_buckets(4096) == [64, 128, 256, 512, 1024, 2048, 4096]
    assert prefill_token_buckets(100) == [64, 100] and prefill_token_buckets(40) == [40]


@pytest.mark.parametrize("arch", FAST_ARCHS)
def test_packed_prefill_equals_the_padded_one(arch: str) -> None:
    """Logits and every cached position of the prompts equal the padded prefill's within float32
    rounding; bucketed, the dummy tail writes only past the last prompt's end in its own slot."""
    model = tiny_model(arch, seed=1)
    if arch == "qwen3":  # non-unit q/k norms, so that they count
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    fwd = BatchedForward(model)
    lengths = (5, 11, 2)
    contexts = [prompt(n, seed=n) for n in lengths]
    pad_cache, pack_cache = two_caches(fwd)
    bucket_cache = two_caches(fwd)[0]
    with torch.inference_mode():
        want = padded(fwd, pad_cache, contexts, first_slot=1)
        got = packed(fwd, pack_cache, contexts, first_slot=1)
        bucketed = packed(fwd, bucket_cache, contexts, first_slot=1, tokens=32, rows=4)[:3]
    terms = chain_terms(model, len(fwd.layers), max(lengths)) + model.config.hidden_size  # + lm_head
    for logits in (got, bucketed):
        torch.testing.assert_close(logits, want, rtol=0, atol=sum_error(F32, terms, float(want.abs().max())))
    for layer in range(len(fwd.layers)):
        kv_terms = chain_terms(model, layer, max(lengths)) + model.config.hidden_size  # + k/v projection
        for cache in (pack_cache, bucket_cache):
            for row, n in enumerate(lengths):
                for mine, theirs in ((cache.keys, pad_cache.keys), (cache.values, pad_cache.values)):
                    want_kv = theirs[layer][1 + row, :, :n]
                    bound = sum_error(F32, kv_terms, float(want_kv.abs().max()))
                    torch.testing.assert_close(mine[layer][1 + row, :, :n], want_kv, rtol=0, atol=bound)
    stale = stacked(two_caches(fwd)[0])
    untouched = torch.ones(stale.shape[2:5], dtype=torch.bool)  # (slots, heads, positions)
    for row, n in enumerate(lengths):
        untouched[1 + row, :, :n] = False
    untouched[3, :, 2:] = False  # the tail: past the last prompt (2 tokens), in its slot
    assert torch.equal(stacked(bucket_cache)[:, :, untouched], stale[:, :, untouched])


def fake_varlen(calls: list[tuple[list[int], int]]) -> Any:
    """A CPU stand-in for torch 2.12's `varlen_attn` (same signature as far as the call goes):
    records (cu_seq_q, max_q) and runs each row's causal attention."""

    def varlen_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_q: torch.Tensor,
                    cu_seq_k: torch.Tensor, max_q: int, max_k: int, *, return_aux: Any = None,
                    scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                    enable_gqa: bool = False) -> torch.Tensor:
        assert window_size == (-1, 0) and enable_gqa and cu_seq_q is cu_seq_k and cu_seq_q.dtype == torch.int32
        bounds = cu_seq_q.tolist()
        calls.append((bounds, max_q))
        assert max(b - a for a, b in zip(bounds, bounds[1:], strict=False)) <= max_q == max_k
        out = torch.empty_like(q)
        for a, b in zip(bounds, bounds[1:], strict=False):
            qr, kr, vr = (x[a:b].transpose(0, 1)[None] for x in (q, k, v))
            out[a:b] = causal_attention(qr, kr, vr, cast(float, scale))[0].transpose(0, 1)
        return out

    return varlen_attn


def test_the_varlen_path_is_one_kernel_call_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[int], int]] = []
    call = kernels.varlen_call(fake_varlen(calls))
    monkeypatch.setattr(kernels, "varlen_kernel", lambda: call)
    model = tiny_model("qwen2", seed=2)
    fwd = BatchedForward(model)
    contexts = [prompt(n, seed=n) for n in (7, 3)]
    rows_cache, varlen_cache = two_caches(fwd)
    with torch.inference_mode():
        want = packed(fwd, rows_cache, contexts, 0, "rows", tokens=16, rows=2)
        got = packed(fwd, varlen_cache, contexts, 0, "varlen", tokens=16, rows=2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same per-row attention, the same order
    assert calls == [([0, 7, 16], 9)] * len(fwd.layers)  # max_seqlen: the longest row, tail included


def test_prefill_path_is_varlen_on_cuda_in_half_precision_and_rows_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(kernels, "varlen_kernel", lambda: kernels.varlen_call(fake_varlen([])))
    assert prefill_path(cuda, torch.bfloat16) == prefill_path(cuda, torch.float16) == "varlen"
    assert prefill_path(cuda, F32) == "padded"  # FlashAttention has no float32
    assert prefill_path(cpu, torch.bfloat16) == prefill_path(cpu, F32) == "rows"
    monkeypatch.setattr(kernels, "varlen_kernel", lambda: None)  # torch 2.4 - 2.9
    monkeypatch.setattr(kernels, "jagged_kernel", lambda: True)
    assert prefill_path(cuda, torch.bfloat16) == "jagged"


def test_the_cpu_engine_prefills_packed_and_decodes_hf_greedy_tokens_as_the_padded_one_does() -> None:
    model = tiny_model("qwen3", seed=3)
    reqs = staggered_requests(6)
    want = [hf_greedy(model, r) for r in reqs]
    eng = engine(model, max_num_seqs=4)
    assert [o.response_ids for o in run_sync(eng, reqs)] == want
    assert set(eng._runner.prefills) == {"rows"}  # the CPU's measured choice (docs/engine.md)
    eng.close()
    eng = engine(model, max_num_seqs=4)
    eng._runner.prefill_path = "padded"
    assert [o.response_ids for o in run_sync(eng, reqs)] == want
    assert set(eng._runner.prefills) == {"padded"}
    eng.close()


def test_rollout_packed_prefill_off_is_the_padded_prefill() -> None:
    """The key the engine bench turns the packed prefill off by (today's path, its baseline)."""
    assert engine_settings(RolloutConfig(packed_prefill="off"), device="cpu", seed=0).packed_prefill is False
    eng = engine(tiny_model("llama"), max_num_seqs=4, packed_prefill="off")
    run_sync(eng, staggered_requests(3))
    assert eng._runner.prefill_path == "padded" and set(eng._runner.prefills) == {"padded"}
    eng.close()


def test_bucketed_prefill_keys_and_eager_overflow_decode_hf_greedy_tokens() -> None:
    """The captured prefill's code path, run eagerly on the CPU over a static cache: prompts
    rounded up to token and row buckets, a prompt set past the largest bucket eager; greedy
    tokens equal HF's, so no dummy tail reached a row."""
    model = tiny_model("llama", seed=4)
    reqs = [*staggered_requests(5), request("long", prompt(70, seed=9), 6)]
    want = [hf_greedy(model, r) for r in reqs]
    eng = engine(model, max_num_seqs=4, cuda_graphs=True)
    runner = eng._runner
    assert runner.bucketed_decode is not None and isinstance(runner.cache, SlotKVCache)
    assert isinstance(runner.forward, BatchedForward)
    runner.prefill_path = "rows"
    runner.bucketed_prefill = BucketedPrefill(runner.forward, runner.cache, 4, 64, path="rows", capture=False)
    assert [o.response_ids for o in run_sync(eng, reqs)] == want
    graphs = runner.bucketed_prefill
    assert graphs.eager == 1  # the 70-token prompt
    assert all(tokens in prefill_token_buckets(64) and rows in (1, 2, 4) for tokens, rows in graphs.steps)
    assert (64, 4) in graphs.steps  # the first admission: 4 prompts of 3..10 tokens
    eng.close()
