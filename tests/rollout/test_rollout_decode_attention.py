"""Decode attention over real lengths: the split-KV Triton kernel (interpreted on the CPU) equals a
float64 attention over each row's own length, for ragged rows (length 1, lengths that no split
or block divides, padding rows of length 0 whose output is zeros) and grouped KV heads; positions
past a row's length and the slots of padding rows hold NaN, so a read of any of them would show.
A decode step and a static (graph-shaped) engine through the kernel equal the matmul path; the
path that ran is counted; the engine keys graphs by bucket alone and accounts the KV it reads."""

from __future__ import annotations

from tests.rollout.triton_interpret import INTERPRET  # first: sets TRITON_INTERPRET before a kernel is imported

# isort: split

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.config.schema import RolloutConfig
from asyncrl.errors import ConfigError
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.attention import PATHS, resolve
from asyncrl.rollout.forward import BatchedForward
from asyncrl.rollout.kernels.decode_attention import decode_attention, split_count
from asyncrl.rollout.settings import engine_settings
from tests.rollout.rollout_testlib import EOS, prompt, settings_of, staggered_requests, tiny_model
from tests.tolerances import assert_within, eps_of

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the CPU's interpreted kernel (tests/gpu runs it compiled)")

LENGTHS = [1, 0, 37, 80, 17, 0]
"""Ragged rows: length 1, two padding rows, 37 and 17 (no 16-block or 3-split divides them), 80 = capacity."""
CAPACITY = 80
SCALE = 0.3


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Float64 attention of row b over its first lengths[b] positions (zeros for length 0);
    query head h reads KV head h // groups, as HF's repeat_kv."""
    rows, heads, head_dim = q.shape
    groups = heads // keys.shape[1]
    out = torch.zeros(rows, heads, head_dim, dtype=torch.float64)
    for b, n in enumerate(lengths):
        if n:
            k = keys[b, :, :n].double().repeat_interleave(groups, 0)  # (H, n, D)
            v = values[b, :, :n].double().repeat_interleave(groups, 0)
            probs = torch.softmax(torch.einsum("hd,hnd->hn", q[b].double(), k) * SCALE, dim=-1)
            out[b] = torch.einsum("hn,hnd->hd", probs, v)
    return out


def bound(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: list[int], splits: int,
          want: torch.Tensor) -> torch.Tensor:
    """Per (row, head), how far the kernel may be from the exact attention, from where it rounds
    (u = eps of the dtype: a cast to bfloat16 rounds to nearest on a GPU, within eps / 2, and
    truncates in Triton 3.6's interpreter, within eps; e = float32's eps):
    - the output rounded to the dtype: u |out|;
    - probabilities rounded to the value dtype before P.V (as HF's eager; none in float32): u max|v|;
    - float32 scores: D products (exact for bfloat16 operands) summed, off by <= D e scale sum|q k|,
      plus the exponential and the max subtraction (4 e of the score); a score error d moves the
      softmax weights by a factor within e^(+-2d), the output by <= 2 d max|v|;
    - float32 sums of the n weighted values and weights, each chunk's rescaling, the combine of
      the chunks: (n + splits + 4) e max|v|."""
    rows, heads, head_dim = q.shape
    groups = heads // keys.shape[1]
    u, e = eps_of(q.dtype), eps_of(torch.float32)
    p_rounding = 0.0 if q.dtype == torch.float32 else u
    limit = torch.zeros(rows, heads, 1, dtype=torch.float64)
    for b, n in enumerate(lengths):
        if n:
            k = keys[b, :, :n].double().abs().repeat_interleave(groups, 0)
            v_max = values[b, :, :n].double().abs().repeat_interleave(groups, 0).amax(dim=(1, 2))  # (H,)
            score = torch.einsum("hd,hnd->hn", q[b].double().abs(), k).amax(dim=1) * SCALE  # (H,)
            drift = (head_dim + 4) * e * score + 4 * e
            limit[b, :, 0] = (p_rounding + 2 * drift + (n + splits + 4) * e) * v_max
    return limit + u * want.abs()


def ragged_inputs(dtype: torch.dtype, groups: int, head_dim: int, kv_heads: int = 2
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (rows, H, D) and a cache (rows + 1 slots) whose every position past a row's length, and
    every padding row's and the spare slot's, is NaN."""
    g = torch.Generator().manual_seed(groups * 100 + head_dim)
    rows = len(LENGTHS)
    q = torch.randn(rows, kv_heads * groups, head_dim, generator=g).to(dtype)
    keys = torch.randn(rows + 1, kv_heads, CAPACITY, head_dim, generator=g).to(dtype)
    values = (3 * torch.randn(rows + 1, kv_heads, CAPACITY, head_dim, generator=g)).to(dtype)
    for b, n in enumerate([*LENGTHS, 0]):
        keys[b, :, n:] = values[b, :, n:] = float("nan")
    return q, keys, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups, head_dim", [(1, 16), (2, 32), (7, 24)])
def test_split_kv_equals_float64_attention_over_each_rows_length(dtype: torch.dtype, groups: int,
                                                                  head_dim: int) -> None:
    q, keys, values = ragged_inputs(dtype, groups, head_dim)
    want = reference(q, keys, values, LENGTHS)
    # a strided view, as the graphs' input buffer hands it; the other column would read past the cache
    lengths = torch.tensor([[n, 10**6] for n in LENGTHS])[:, 0]
    for splits in (1, 3):  # one launch; chunks of 32 (80 -> 3 chunks, 37 -> 2 and an empty one)
        got = decode_attention(q, keys, values, lengths, SCALE, splits, block_n=16)
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.isfinite(got).all()  # no NaN read
        assert_within(got, want, bound(q, keys, values, LENGTHS, splits, want), f"{dtype} G={groups} S={splits}")
        assert (got[torch.tensor(LENGTHS) == 0] == 0).all()  # padding rows: zeros


COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from asyncrl.rollout.kernels import decode_attention as m

def compile_for_gpu(fn, types, consts):
    signature = {name: "constexpr" if name in consts else types[name] for name in fn.arg_names}
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32))

ints = "length_row q_row q_head k_slot k_head k_pos v_slot v_head v_pos o_row o_head o_split l_row l_head"
for dtype, splits in (("bf16", 1), ("bf16", 8), ("fp32", 8)):
    out = f"*{dtype}" if splits == 1 else "*fp32"
    types = dict(q_ptr=f"*{dtype}", k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", lengths_ptr="*i64", out_ptr=out,
                 lse_ptr=out, scale="fp32", **{name: "i32" for name in ints.split()})
    compile_for_gpu(m._split_kv_kernel, types, dict(GROUPS=7, BLOCK_G=16, HEAD_DIM=64, BLOCK_D=64, BLOCK_N=64,
                                                    SPLITS=splits))
types = dict(part_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16",
             **{name: "i32" for name in "p_row p_head p_split l_row l_head o_row o_head".split()})
compile_for_gpu(m._combine_kernel, types, dict(HEAD_DIM=64, BLOCK_D=64, SPLITS=8, BLOCK_S=8))
"""


def test_the_kernels_compile_for_a_gpu_without_one() -> None:
    """The interpreter runs Python, not Triton's compiler: compile both kernels for an H100/H200
    (sm_90, through ptxas) at Qwen2-0.5B's shape in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_split_count_fills_the_device_within_the_capacity() -> None:
    # the docstring's example: Qwen2-0.5B (2 KV heads, capacity 2304) on an H200 (528 programs)
    assert [split_count(rows, 2, 2304, 528) for rows in (1, 64, 256)] == [16, 8, 2]
    assert split_count(1, 2, 100, 528) == 1  # one 64-position chunk fits a 100-position cache
    assert split_count(64, 2, 2304, 1) == 1


def test_resolve_picks_the_kernel_on_cuda_and_refuses_it_uncompiled(monkeypatch) -> None:
    assert resolve("auto", torch.device("cpu")) == "matmul"
    assert resolve("auto", torch.device("cuda")) == "triton"
    assert resolve("triton", torch.device("cpu")) == "triton"  # interpreted (this module set TRITON_INTERPRET)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError, match="rollout.decode_attention"):
        resolve("triton", torch.device("cpu"))
    cfg = RolloutConfig(decode_attention="matmul")
    assert engine_settings(cfg, device="cuda", seed=0).decode_attention == "matmul"


def test_a_decode_step_through_the_kernel_equals_the_matmul_path() -> None:
    model = tiny_model("qwen3")  # grouped KV heads, head_dim 32
    contexts = [prompt(n, seed=n) for n in (5, 70, 1)]  # 70: past one 64-position chunk
    logits: dict[str, torch.Tensor] = {}
    for path in ("matmul", "triton"):
        forward = BatchedForward(model, decode_attention=path)
        cache = forward.new_cache(max_slots=4, device="cpu")
        cache.reserve(3, 128)
        lengths = torch.tensor([len(c) for c in contexts])
        padded = torch.zeros(3, int(lengths.max()), dtype=torch.int64)
        for row, ctx in enumerate(contexts):
            padded[row, : len(ctx)] = torch.tensor(ctx)
        before = dict(PATHS)
        with torch.inference_mode():
            forward.prefill(cache, padded, lengths, first_slot=0)
            logits[path] = forward.decode(cache, torch.tensor([3, 9, 27]), lengths)
        assert PATHS[path] == before.get(path, 0) + 1 and sum(PATHS.values()) == sum(before.values()) + 1
    # float32 both ways, the same bound as the forward's against HF (test_rollout_forward.py)
    torch.testing.assert_close(logits["triton"], logits["matmul"], rtol=0, atol=1e-5)


def test_a_static_engine_through_the_kernel_keys_graphs_by_bucket_and_reads_real_lengths() -> None:
    model = tiny_model("llama")
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_tokens=6))
            for r in staggered_requests(3)]  # 3 rows in bucket 4: one padding row, then 2 and 1
    want = run_sync(TorchEngine(model, EOS, settings_of(cuda_graphs=True)), reqs)
    before = PATHS["triton"]
    eng = TorchEngine(model, EOS, settings_of(cuda_graphs=True, decode_attention="triton"))
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    graphs = eng._runner.bucketed_decode
    assert graphs is not None and eng._runner.forward.decode_attention == "triton"
    assert {length for _, length in graphs.steps} == {0}  # one key per bucket, whatever the lengths
    assert PATHS["triton"] - before == sum(graphs.steps.values())
    eng.close()
