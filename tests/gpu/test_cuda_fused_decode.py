"""The fused decode step on CUDA (skipped without a GPU): `rollout.fused_decode=auto` takes it,
the kernels compiled for the device round as HF's modules, a captured decode graph launches at
most 12 kernels per layer and 300 per 24-layer step (counted by torch.profiler over a replay;
today's unfused graph printed beside it), and bf16 greedy tokens equal HF `generate`."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from asyncrl.rollout import run_sync
from asyncrl.rollout.forward import BatchedForward
from tests.rollout.rollout_testlib import EOS, engine, prompt, request, tiny_config, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
BF16 = torch.bfloat16
DEPTH = 24


def replay_kernels(arch: str, layers: int, fused: str) -> int:
    """Kernels one replay of a captured 4-row decode graph launches (profiler, memcpy/memset aside)."""
    config = tiny_config(arch)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().to(device=CUDA, dtype=BF16)
    eng = engine(model, device="cuda", max_num_seqs=4, fused_decode=fused)
    run_sync(eng, [request(f"r{i}", prompt(5, seed=i), 4) for i in range(4)])
    graphs = eng._runner.bucketed_decode
    assert graphs is not None and graphs.captures > 0
    graph = next(iter(graphs.graphs._graphs.values()))[0]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    eng.close()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith("Mem"))


def test_auto_takes_the_fused_step_on_cuda() -> None:
    eng = engine(tiny_model("qwen3").to(CUDA), device="cuda", max_num_seqs=2)
    forward = eng._runner.forward
    assert isinstance(forward, BatchedForward) and forward.fused_decode
    eng.close()


def test_kernels_per_captured_decode_graph() -> None:
    counts = {}
    for fused in ("off", "on"):
        one, two, deep = (replay_kernels("qwen3", n, fused) for n in (1, 2, DEPTH))
        counts[fused] = two - one, deep
        print(f"qwen3 bf16 decode graph, fusion {fused}: {two - one} kernels per layer, {deep} per {DEPTH}-layer step")
    assert counts["on"][0] <= 12 and counts["on"][1] <= 300
    assert counts["off"][0] > counts["on"][0]


def test_kernels_round_as_hf_on_cuda() -> None:
    kernels = importlib.import_module("asyncrl.rollout.kernels.elementwise")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(896, generator=g).to(device=CUDA, dtype=BF16)
    # multiples of 1/8: the variance sums exactly in any order
    residual, delta = ((torch.randint(-16, 17, (2, 7, 896), generator=g) / 8).to(device=CUDA, dtype=BF16))
    normed, summed = kernels.add_rms_norm(delta, residual, weight, 1e-6)
    norm = LlamaRMSNorm(896, eps=1e-6).to(device=CUDA, dtype=BF16)
    norm.weight.data.copy_(weight)
    assert torch.equal(summed, residual + delta) and torch.equal(normed, norm(residual + delta))
    gate_up = (3 * torch.randn(7, 2 * 4864, generator=g)).to(device=CUDA, dtype=BF16)
    gate, up = gate_up.chunk(2, dim=-1)
    eps = torch.finfo(BF16).eps  # exp may differ by a float32 ulp: one bf16 rounding each side
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, rtol=2 * eps, atol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_bf16_greedy_equals_hf_generate(arch: str) -> None:
    model = tiny_model(arch, seed=0).to(device=CUDA, dtype=BF16)
    prompt_ids = prompt(6, seed=1)
    ref = model.generate(torch.tensor([prompt_ids], device=CUDA), max_new_tokens=12, min_new_tokens=12,
                         do_sample=False, pad_token_id=EOS)[0, 6:].tolist()
    eng = engine(model, device="cuda", fused_decode="on")
    assert run_sync(eng, [request("a", prompt_ids, 12)])[0].response_ids == ref
    eng.close()
