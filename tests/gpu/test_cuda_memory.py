"""The KV cache sized from a real device's memory (skipped without a GPU): allocated once at
engine build, this process within rollout.gpu_memory_utilization of the device, fewer slots
when short (and still equal to eager decoding), ConfigError when not one sequence fits."""

from __future__ import annotations

import pytest
import torch

from asyncrl.errors import ConfigError
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.memory import DeviceMemory, activation_reserve_bytes, device_memory
from asyncrl.scheduling.micro_budget import ModelShape
from tests.rollout.rollout_testlib import EOS, settings_of, staggered_requests, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MiB = 2**20
TINY = ModelShape(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16)
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # 2 layers x K,V x 2 heads x 16 x float32


def memory() -> DeviceMemory:
    """What the engine reads: free and total device memory, what this process holds."""
    found = device_memory(torch.device("cuda"))
    assert found is not None
    return found


def test_the_cache_is_sized_from_device_memory_and_allocated_once():
    model = tiny_model("qwen2").cuda()
    before, allocated = memory(), torch.cuda.memory_allocated()
    eng = TorchEngine(model, EOS, settings_of(device="cuda", max_num_seqs=8, max_model_len=1024))
    plan, cache = eng._runner.kv_plan, eng._runner.cache
    assert plan is not None and (plan.slots, plan.capacity) == (8, 1024)
    assert (cache.slots, cache.capacity) == (8, 1024) and cache.bytes_per_token == BYTES_PER_TOKEN
    assert plan.kv_bytes == 8 * 1024 * BYTES_PER_TOKEN <= torch.cuda.memory_allocated() - allocated
    reserve = activation_reserve_bytes(TINY, max_num_seqs=8, max_model_len=1024, max_prefill_tokens=4096)
    want = min(int(0.5 * before.total) - before.held, before.free) - reserve
    assert abs(plan.available_bytes - want) < 16 * MiB
    reqs = staggered_requests(7)
    want = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", cuda_graphs=False)), reqs)
    assert [o.response_ids for o in run_sync(eng, reqs)] == [o.response_ids for o in want]
    assert cache.generation == 1  # never reallocated
    eng.close()


def test_short_memory_lowers_the_slots_and_stays_within_the_fraction():
    model = tiny_model("llama").cuda()
    max_model_len = 2**17  # 64 MiB a slot
    per_slot = max_model_len * BYTES_PER_TOKEN
    reserve = activation_reserve_bytes(TINY, max_num_seqs=8, max_model_len=max_model_len, max_prefill_tokens=4096)
    before = memory()
    fraction = (before.held + reserve + 3.5 * per_slot) / before.total  # room for 3.5 slots
    eng = TorchEngine(model, EOS, settings_of(device="cuda", max_num_seqs=8, kv_budget_tokens=max_model_len,
                                                 max_model_len=max_model_len, gpu_memory_utilization=fraction))
    assert eng._runner.max_num_seqs == eng._scheduler.max_num_seqs == eng._runner.cache.slots == 3
    assert memory().held <= fraction * before.total - reserve  # the cache took no more than its share
    reqs = staggered_requests(7)
    want = run_sync(TorchEngine(model, EOS, settings_of(device="cuda", cuda_graphs=False)), reqs)
    assert [o.response_ids for o in run_sync(eng, reqs)] == [o.response_ids for o in want]
    assert {size for size, _ in eng._runner.bucketed_decode.steps} <= {1, 2, 3}
    eng.close()


def test_no_room_for_one_sequence_raises_config_error():
    model = tiny_model("llama").cuda()
    with pytest.raises(ConfigError, match="^rollout.gpu_memory_utilization=1e-06 leaves"):
        TorchEngine(model, EOS, settings_of(device="cuda", gpu_memory_utilization=1e-6))
