"""The fused decode step (issue 24, deliverable 3) on the CPU, its Triton kernels interpreted:
each kernel against the eager ops it replaces (bf16 rounded as HF's modules round), a fused step's
logits against the unfused step's, the engine's greedy tokens against HF `generate`, weight loads
into the merged projections, `rollout.fused_decode`'s resolution, and the kernel launches per
decode layer and step (the CPU proxy of a launch-bound GPU step)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from asyncrl.errors import ConfigError
from asyncrl.models.tensors import checksum, export_named
from asyncrl.rollout import run_sync
from asyncrl.rollout.forward import BatchedForward, _rope
from asyncrl.rollout.graphs import BucketedDecode
from asyncrl.rollout.kernels import use_fused_decode
from asyncrl.rollout.kernels.decode_attention import split_count, target_programs
from asyncrl.rollout.kv_cache import SlotKVCache
from asyncrl.rollout.merged import aliases
from asyncrl.rollout.sampler import DeviceSampler
from asyncrl.types import SamplingParams
from tests.rollout import triton_interpret  # the interpreter's fixes for the attention kernel
from tests.rollout.launch_counts import LaunchCounter
from tests.rollout.rollout_testlib import (
    FAST_ARCHS,
    engine,
    prompt,
    request,
    staggered_requests,
    tiny_config,
    tiny_model,
)
from tests.rollout.test_rollout_architectures import hf_greedy
from tests.tolerances import eps_of, sum_error

pytestmark = pytest.mark.skipif(not triton_interpret.INTERPRET, reason="CUDA present: tests/gpu runs the kernels")
BF16 = torch.bfloat16
MAX_LAYER_LAUNCHES = 12
MAX_STEP_LAUNCHES = 300
DEPTH = 24  # Qwen2-0.5B's layers: the step the GPU numbers are for


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    """The kernel module, interpreted (imported after TRITON_INTERPRET=1 was set)."""
    import importlib

    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module("asyncrl.rollout.kernels.elementwise")
    if not isinstance(module._add_rms_norm_kernel, InterpretedFunction):  # imported before the env was set
        module = importlib.reload(module)
    return module


def eighths(*shape: int, seed: int) -> torch.Tensor:
    """bf16 multiples of 1/8 in [-2, 2]: their squares sum exactly in float32 in any order, so a
    norm's variance (and so every rounding after it) is the same whatever order the sum takes."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-16, 17, shape, generator=g) / 8).to(BF16)


def hf_norm(weight: torch.Tensor, eps: float) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(weight.shape[0], eps=eps).to(weight.dtype)
    norm.weight.data.copy_(weight)
    return norm


def test_add_rms_norm_rounds_as_hf(kernels) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, generator=g).to(BF16)
    residual, delta = eighths(7, 96, seed=1), eighths(7, 96, seed=2)
    normed, summed = kernels.add_rms_norm(delta, residual, weight, 1e-6)
    expected = hf_norm(weight, 1e-6)(residual + delta)
    assert torch.equal(summed, residual + delta) and torch.equal(normed, expected)
    alone, same = kernels.add_rms_norm(None, residual, weight, 1e-6)
    assert same is residual and torch.equal(alone, hf_norm(weight, 1e-6)(residual))
    # not vacuous: rounding once (skipping HF's cast before the weight) gives other values here
    x = (residual + delta).float()
    once = (weight.float() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(BF16)
    assert not torch.equal(once, expected)
    # random bf16 sums round exactly as torch's add; float32 within the variance's summation error
    a, b = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g)
    assert torch.equal(kernels.add_rms_norm(a.to(BF16), b.to(BF16), weight, 1e-6)[1], a.to(BF16) + b.to(BF16))
    out32, _ = kernels.add_rms_norm(a, b, weight.float(), 1e-6)
    ref32 = F.rms_norm(a + b, (96,), weight.float(), 1e-6)
    torch.testing.assert_close(out32, ref32, rtol=sum_error(torch.float32, 96, 1.0) + 4 * eps_of(torch.float32), atol=0)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_cache_write_equals_the_eager_ops(kernels, qk_norm: bool) -> None:  # type: ignore[no-untyped-def]
    heads, kv_heads, d, rows = 4, 2, 32, 3
    model = tiny_model("qwen3", seed=5).to(BF16)  # head_dim 32, two halves of 16
    attn = model.model.layers[0].self_attn
    qkv = eighths(rows, (heads + 2 * kv_heads) * d, seed=6)
    positions = torch.tensor([[3, 1], [0, 2], [9, 5]])[:, 0]  # strided, as graphs' input buffer column
    cos, sin = model.model.rotary_emb(qkv, positions[:, None])  # (B, 1, D), bf16
    cos, sin = cos[:, 0], sin[:, 0]
    keys = torch.zeros(4, kv_heads, 16, d, dtype=BF16)
    values = torch.zeros_like(keys)
    norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon) if qk_norm else None
    q = kernels.rope_cache_write(qkv, cos, sin, keys, values, positions, heads=heads, kv_heads=kv_heads,
                                 head_norms=norms)
    q_ref, k_ref, v_ref = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q_ref, k_ref = q_ref.view(rows, heads, d), k_ref.view(rows, kv_heads, d)
    if qk_norm:
        q_ref, k_ref = attn.q_norm(q_ref), attn.k_norm(k_ref)
    assert torch.equal(q, _rope(q_ref, cos[:, None], sin[:, None]))
    slots = torch.arange(rows)
    assert torch.equal(keys[slots, :, positions], _rope(k_ref, cos[:, None], sin[:, None]))
    assert torch.equal(values[slots, :, positions], v_ref.reshape(rows, kv_heads, d))
    written = torch.zeros(4, 16, dtype=torch.bool)
    written[slots, positions] = True
    assert not keys.permute(0, 2, 1, 3)[~written].any() and not values.permute(0, 2, 1, 3)[~written].any()


def test_silu_mul_equals_hf_mlp_activation(kernels) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(7)
    gate_up = (3 * torch.randn(6, 2 * 80, generator=g)).to(BF16)
    gate, up = gate_up.chunk(2, dim=-1)
    # exp may differ from torch's by a float32 ulp, which moves SiLU's bf16 rounding by at most
    # one bf16 ulp (eps relative) and the product's by one more
    torch.testing.assert_close(kernels.silu_mul(gate_up, block=32), F.silu(gate) * up, rtol=2 * eps_of(BF16), atol=0)
    gate_up = gate_up.float()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, rtol=4 * eps_of(torch.float32), atol=0)


def decode_logits(fwd: BatchedForward, contexts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Prefill `contexts` (equal lengths), then `steps` decode steps; the logits of each step."""
    n, t = len(contexts), len(contexts[0])
    cache = fwd.new_cache(max_slots=n, device="cpu")
    cache.reserve(n, t + steps)
    out = []
    with torch.inference_mode():
        fwd.prefill(cache, torch.tensor(contexts), torch.full((n,), t), first_slot=0)
        for step in range(steps):
            tokens = torch.tensor([(5 * step + row) % 64 for row in range(n)])
            out.append(fwd.decode(cache, tokens, torch.full((n,), t + step)))
    return out


@pytest.mark.parametrize("arch", FAST_ARCHS)
def test_fused_decode_logits_equal_the_unfused_step(arch: str) -> None:
    model = tiny_model(arch, seed=8)
    contexts = [list(prompt(5, seed=s)) for s in range(3)]
    unfused = decode_logits(BatchedForward(copy.deepcopy(model)), contexts, steps=2)
    fused = decode_logits(BatchedForward(model, fused_decode=True), contexts, steps=2)
    for a, b in zip(fused, unfused, strict=True):  # the bound the fast path meets against HF's forward
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_engine_with_fusion_on_equals_hf_greedy(arch: str) -> None:
    model = tiny_model(arch, seed=3)
    reqs = [request(f"r{i}", prompt(4 + 3 * i, seed=i), max_tokens=6 - 2 * i) for i in range(2)]
    eng = engine(model, max_num_seqs=4, fused_decode="on", cuda_graphs=True)
    assert eng._runner.forward.fused_decode  # type: ignore[union-attr]
    counter = LaunchCounter()
    with counter.triton_launches():
        outs = run_sync(eng, reqs)
    eng.close()
    assert counter.triton > 0  # the fused kernels ran
    reference = copy.deepcopy(model)  # the engine's parameters are views of its merged buffers
    for req, out in zip(reqs, outs, strict=True):
        assert out.response_ids == hf_greedy(reference, req), (arch, req.request_id)


def test_weight_loads_write_the_merged_buffers_in_place() -> None:
    model = tiny_model("qwen2", seed=9)  # q/k/v biases: merged too
    eng = engine(model, max_num_seqs=4, fused_decode="on", cuda_graphs=True)
    fwd = eng._runner.forward
    assert isinstance(fwd, BatchedForward)
    pointers = [(m.qkv_weight.data_ptr(), m.gate_up_weight.data_ptr()) for m in fwd._merged]
    trainer = tiny_model("qwen2", seed=10)
    sent = export_named(trainer)
    run_sync_load(eng, sent)
    assert eng.weights_checksum() == checksum(sent)
    for i, (layer, merged) in enumerate(zip(trainer.model.layers, fwd._merged, strict=True)):
        attn, mlp = layer.self_attn, layer.mlp
        assert (merged.qkv_weight.data_ptr(), merged.gate_up_weight.data_ptr()) == pointers[i]
        assert aliases(merged, fwd.layers[i].self_attn, fwd.layers[i].mlp)
        assert torch.equal(merged.qkv_weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert merged.qkv_bias is not None
        assert torch.equal(merged.qkv_bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        assert torch.equal(merged.gate_up_weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    req = staggered_requests(1)[0]
    assert run_sync(eng, [req])[0].response_ids == hf_greedy(trainer, req)
    eng.close()


def run_sync_load(eng, named: dict[str, torch.Tensor]) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    asyncio.run(eng.load_weights(named, version=1))


def test_merging_twice_shares_the_buffers() -> None:
    model = tiny_model("llama", seed=11)
    first, second = BatchedForward(model, fused_decode=True), BatchedForward(model, fused_decode=True)
    assert all(a.qkv_weight.data_ptr() == b.qkv_weight.data_ptr() for a, b in zip(first._merged, second._merged))
    assert all(aliases(m, layer.self_attn, layer.mlp) for m, layer in zip(first._merged, first.layers))


def test_fused_decode_key_resolves_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert not use_fused_decode("auto", cpu) and not use_fused_decode("off", cpu)
    assert use_fused_decode("on", cpu)  # interpreted, as in these tests
    assert not engine(tiny_model("llama"), max_num_seqs=2)._runner.forward.fused_decode  # type: ignore[union-attr]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="rollout.fused_decode"):
        use_fused_decode("on", cpu)


CACHE_POSITIONS = 256
"""The counted step's cache capacity: long enough for the split-KV kernel to split these rows
(`split_count`: 4 chunks of 64 positions), so its combine kernel launches, as on a GPU."""


def launches(arch: str, layers: int, *, fused: bool) -> LaunchCounter:
    """Launches of what a captured decode step runs (3 rows of a `layers`-deep tiny `arch` model,
    bf16): the forward and the sampling into the sampler's buffers (`BucketedDecode._run`, at
    temperature 1 as the engine bench samples); fused with the split-KV attention, as on a GPU,
    else today's unfused step."""
    config = tiny_config(arch)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().to(BF16)
    fwd = BatchedForward(model, fused_decode=fused, decode_attention="triton" if fused else "matmul")
    cache = fwd.new_cache(max_slots=4, device="cpu")
    assert isinstance(cache, SlotKVCache)
    cache.static = True
    cache.reserve(4, CACHE_POSITIONS)
    assert split_count(3, fwd.kv_heads, cache.capacity, target_programs(cache.device)) > 1  # the combine runs
    sampler = DeviceSampler(4, cache.device)
    mode = sampler.set_rows([1, 2, 3], [SamplingParams(max_tokens=8, temperature=1.0)] * 3)
    sampler.set_positions([3, 4, 5])
    graphs = BucketedDecode(fwd, cache, 3, sampler, capture=False)
    with torch.inference_mode():
        graphs([3, 4, 5], mode)  # the inputs' host-to-device copy is outside a graph: not counted
        step = graphs.step_of(graphs.key([3, 4, 5]))
        counter = LaunchCounter()
        with counter.triton_launches(), counter:
            step()
    return counter


def test_kernel_launches_per_decode_layer_and_step() -> None:
    """Qwen3 (every part, q/k norms too), the combine kernel and the in-graph sampling counted. Per
    layer: a 2-layer step less a 1-layer step; per step at Qwen2-0.5B's depth: the 1-layer step
    plus 23 more layers (launches do not depend on width)."""
    arch, counts = "qwen3", {}
    for fused in (False, True):
        one, two = launches(arch, 1, fused=fused), launches(arch, 2, fused=fused)
        per_layer = two.total - one.total
        counts[fused] = per_layer, one.total + (DEPTH - 1) * per_layer
        print(f"{arch} {'fused' if fused else 'unfused (today)'}: {per_layer} launches per layer "
              f"({dict(two.aten - one.aten)}, {two.triton - one.triton} Triton), {counts[fused][1]} per "
              f"{DEPTH}-layer step")
        if fused:  # two RMSNorms, rotary + cache write, split-KV attention and its combine, SiLU-mul
            assert two.triton - one.triton == 6
        assert one.aten["searchsorted"] == 1  # the inverse-CDF sampling is part of the counted step
    assert counts[True][0] <= MAX_LAYER_LAUNCHES and counts[True][1] <= MAX_STEP_LAUNCHES
    assert counts[False][0] > 3 * MAX_LAYER_LAUNCHES  # today's step: not a vacuous comparison
