"""Split-KV decode attention compiled for the GPU (skipped without CUDA): the kernel equals SDPA
(float64, over each row's real length) at the Qwen2-0.5B attention shape, padding rows zeros and
positions past each row's length never read (NaN there); the engine's decode graphs take the
kernel (one graph per batch bucket, the kernel launched by a replay) and decode the matmul path's
tokens; and a print, not asserted, of the KV bytes a step reads and the attention time of both
paths at the GPU bench's shape."""

from __future__ import annotations

import tests.rollout.triton_interpret  # noqa: F401  first: without CUDA, the kernel module below imports interpreted

# isort: split

import math

import pytest
import torch
import torch.nn.functional as F

from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.attention import PATHS, _additive_mask, _attend
from asyncrl.rollout.graphs import attention_length
from asyncrl.rollout.kernels.decode_attention import decode_attention, split_count, target_programs
from tests.rollout.rollout_testlib import EOS, settings_of, staggered_requests, tiny_model
from tests.rollout.test_rollout_decode_attention import SCALE, bound
from tests.tolerances import assert_within

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

KV_HEADS, GROUPS, HEAD_DIM, CAPACITY = 2, 7, 64, 2304  # Qwen2-0.5B's attention, the bench's cache
LENGTHS = [1, 0, 37, 300, CAPACITY, 511, 64, 0, 1000]


def poisoned_cache(rows: int, lengths: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q and one layer's K/V, NaN past each row's length (and in padding rows' slots)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(rows, KV_HEADS * GROUPS, HEAD_DIM, device="cuda", generator=g).to(dtype)
    keys = torch.randn(rows, KV_HEADS, CAPACITY, HEAD_DIM, device="cuda", generator=g).to(dtype)
    values = (3 * torch.randn(rows, KV_HEADS, CAPACITY, HEAD_DIM, device="cuda", generator=g)).to(dtype)
    for b, n in enumerate(lengths):
        keys[b, :, n:] = values[b, :, n:] = float("nan")
    return q, keys, values


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """SDPA in float64 over each row's first lengths[b] positions, KV heads repeated; zeros for length 0."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lengths):
        if n:
            k = keys[b, :, :n].double().repeat_interleave(GROUPS, 0)
            v = values[b, :, :n].double().repeat_interleave(GROUPS, 0)
            out[b] = F.scaled_dot_product_attention(q[b, :, None].double(), k, v, scale=SCALE)[:, 0]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_equals_sdpa_over_each_rows_length(dtype: torch.dtype) -> None:
    q, keys, values = poisoned_cache(len(LENGTHS), LENGTHS, dtype)
    want = sdpa(q, keys, values, LENGTHS)
    lengths = torch.tensor(LENGTHS, device="cuda")
    programs = target_programs(q.device)
    for splits in sorted({1, split_count(len(LENGTHS), KV_HEADS, CAPACITY, programs)}):
        got = decode_attention(q, keys, values, lengths, SCALE, splits)
        assert torch.isfinite(got).all()
        assert_within(got.cpu(), want.cpu(), bound(q.cpu(), keys.cpu(), values.cpu(), LENGTHS, splits, want.cpu()),
                      f"{dtype} splits={splits}")
        assert (got[lengths == 0] == 0).all()


def test_the_decode_graphs_run_the_kernel_once_per_bucket() -> None:
    model = tiny_model("qwen2").cuda()
    reqs = staggered_requests(7)
    want = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", decode_attention="matmul")), reqs)
    before = PATHS["triton"]
    eng = TorchEngine(model, EOS, settings_of(device="cuda"))  # auto: the kernel on CUDA
    graphs = eng._runner.bucketed_decode
    assert graphs is not None and graphs.capture and eng._runner.forward.decode_attention == "triton"
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-4)
    assert {key[1] for key in graphs.steps} == {0}  # no attention length in the key
    buckets = [key[0] for key in graphs.graphs._graphs]
    assert graphs.captures == len(graphs.graphs._graphs) == len(set(buckets))  # captured once per bucket
    assert PATHS["triton"] - before == 2 * graphs.captures  # each capture: a warm-up run, then the captured one
    graph = next(iter(graphs.graphs._graphs.values()))[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()  # the engine is done with the cache: a replay rewrites what that step wrote
        torch.cuda.synchronize()
    assert any("_split_kv_kernel" in event.name for event in prof.events())
    eng.close()


def _mean_ms(fn, iters: int = 50) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


@pytest.mark.parametrize("rows", [64, 256])
def test_print_kv_bytes_read_and_attention_time(rows: int) -> None:
    """One layer, bf16, contexts drawn like the GPU bench's (lognormal around 542, at most the
    capacity): what each path reads and how long it takes. Printed for the report, not asserted."""
    g = torch.Generator().manual_seed(rows)
    contexts = [min(CAPACITY, max(1, int(math.exp(6.0 + 0.8 * float(torch.randn(1, generator=g))))))
                for _ in range(rows)]
    q, keys, values = poisoned_cache(rows, [CAPACITY] * rows, torch.bfloat16)
    lengths = torch.tensor(contexts, device="cuda")
    splits = split_count(rows, KV_HEADS, CAPACITY, target_programs(q.device))
    padded = attention_length(max(contexts) - 1, CAPACITY)
    positions = lengths - 1
    allowed = torch.arange(padded, device="cuda")[None] <= positions[:, None]
    mask = _additive_mask(allowed[:, None, None], torch.bfloat16)
    grouped = q.view(rows, KV_HEADS, GROUPS, HEAD_DIM)
    kernel_ms = _mean_ms(lambda: decode_attention(q, keys, values, lengths, SCALE, splits))
    matmul_ms = _mean_ms(lambda: _attend(grouped, keys[:, :, :padded], values[:, :, :padded], mask, SCALE))
    per_token = 2 * KV_HEADS * HEAD_DIM * 2  # K and V of one layer, bf16
    real_mb, padded_mb = sum(contexts) * per_token / 1e6, rows * padded * per_token / 1e6
    print(f"\n{rows} rows, one layer: KV read {real_mb:.2f} MB (kernel, {splits} splits) vs {padded_mb:.2f} MB "
          f"(matmul to {padded}); {kernel_ms * 1e3:.1f} us vs {matmul_ms * 1e3:.1f} us; "
          f"kernel at {real_mb / kernel_ms / 1e3:.2f} TB/s")
