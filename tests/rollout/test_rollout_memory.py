"""KV-cache sizing from device memory (asyncrl.rollout.memory): the pure plan against
hand-computed numbers, and the engine on the CPU with a fake device memory, through the same
code path a GPU takes (a fixed static cache, fewer slots when short, ConfigError when none)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import asyncrl.rollout.runner as runner_module
from asyncrl.errors import ConfigError, RolloutError
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.rollout.memory import DeviceMemory, activation_reserve_bytes, plan_kv_cache
from asyncrl.scheduling.micro_budget import ModelShape
from tests.rollout.rollout_testlib import EOS, prompt, request, settings_of, staggered_requests, tiny_model

GiB, MiB, KiB = 2**30, 2**20, 2**10
QWEN2_05B = ModelShape(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                       num_kv_heads=2, head_dim=64)
TINY = ModelShape(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16)
TINY_RESERVE = 297_826_304
"""8 rows, max_model_len 64, 4096 prefill tokens: sampling 8*64*4*10 = 20,480; decode
8*(64*4 + 4*64*4) = 10,240; prefill 4096 * (4*128 + 8*64 + 6*(4+2+2)*16) * 4 = 29,360,128;
slack 268,435,456."""
TINY_SLOT = 2 * 2 * 2 * 16 * 4 * 64
"""2 layers x K and V x 2 heads x 16 x 4 B per token, 64 positions: 32 KiB."""


def plan(free: float = 78, held: float = 2, **kw: float):
    """80 GiB device, `held` GiB by this process, `free` GiB free; 12 KiB a token, 2048 a slot."""
    args = dict(gpu_memory_utilization=0.5, bytes_per_token=12 * KiB, max_model_len=2048, max_num_seqs=256,
                reserve_bytes=1 * GiB)
    memory = DeviceMemory(free=int(free * GiB), total=80 * GiB, held=int(held * GiB))
    return plan_kv_cache(memory, **{**args, **kw})


def test_activation_reserve_against_hand_computed_numbers():
    # Qwen2-0.5B, 64 rows: 389 MB sampling + 47 MB decode + 549 MB prefill + 256 MiB slack
    want = 64 * 151936 * 4 * 10 + 64 * (151936 * 4 + 14 * 2304 * 4) + 4096 * 33536 * 4 + 256 * MiB
    assert want == 1_253_998_592
    got = activation_reserve_bytes(QWEN2_05B, max_num_seqs=64, max_model_len=2304, max_prefill_tokens=4096)
    assert got == want
    assert activation_reserve_bytes(TINY, max_num_seqs=8, max_model_len=64, max_prefill_tokens=4096) == TINY_RESERVE
    # one admission may prefill a whole max_model_len however small the prefill budget
    longer = activation_reserve_bytes(TINY, max_num_seqs=8, max_model_len=8192, max_prefill_tokens=4096)
    assert longer - TINY_RESERVE == 4096 * 7168 + 8 * 4 * (8192 - 64) * 4


def test_plan_fits_the_share_minus_what_this_process_holds_minus_reserve():
    # min(0.5 x 80 - 2, 78) - 1 = 37 GiB; a slot is 12 KiB x 2048 = 24 MiB: 1578 fit
    p = plan(max_num_seqs=4096)
    assert (p.slots, p.capacity, p.available_bytes) == (1578, 2048, 37 * GiB)
    assert p.kv_bytes == 1578 * 24 * MiB
    assert plan().slots == 256  # max_num_seqs caps it
    assert plan(gpu_memory_utilization=0.05).slots == 42  # 4 - 2 - 1 = 1 GiB: 42.7 slots


def test_this_process_counts_against_the_share_other_processes_only_through_free():
    # a colocated trainer in this process holding 30 GiB: min(40 - 32, 48) - 1 = 7 GiB, 298 slots
    assert plan(free=48, held=32, max_num_seqs=4096).slots == 298
    # a trainer process holding 30 GiB (capped at the other half): the engine keeps its share
    assert plan(free=48, held=2, max_num_seqs=4096).slots == 1578
    # another process holding 60 GiB: only what is free, min(38, 18) - 1 = 17 GiB, 725 slots
    assert plan(free=18, held=2, max_num_seqs=4096).slots == 725


def test_no_slot_raises_naming_the_key_and_the_numbers():
    with pytest.raises(ConfigError) as err:
        plan(free=40, held=40)  # min(0, 40) - 1 < 0
    message = str(err.value)
    assert message.startswith("rollout.gpu_memory_utilization=0.5 leaves -1.00 GiB") and "\n" not in message
    assert "min(0.5 x 80.00 GiB total - 40.00 GiB held by this process, 40.00 GiB free) - 1.00 GiB reserved" \
        in message and "2048 tokens" in message and "raise rollout.gpu_memory_utilization" in message
    with pytest.raises(ConfigError, match="free the device"):  # the device is full, the share is not
        plan(free=0.5)
    with pytest.raises(ConfigError):  # 23 MiB available, a slot needs 24
        plan(held=39 - 23 / 1024)
    assert plan(held=39 - 24 / 1024).slots == 1


def fake_device(monkeypatch, slots: float, fraction: float = 0.5) -> None:
    """The runner reads this instead of a GPU: room for `slots` slots of the tiny model at
    max_model_len 64 besides 1 GiB this process holds and the reserve."""
    held = 1 * GiB
    total = int((held + TINY_RESERVE + slots * TINY_SLOT) / fraction) + 1
    memory = DeviceMemory(free=total - held, total=total, held=held)
    monkeypatch.setattr(runner_module, "device_memory", lambda device: memory)


def sized_engine(model, **kw) -> TorchEngine:
    return TorchEngine(model, EOS, settings_of(cuda_graphs=True, max_num_seqs=8, max_model_len=64, **kw))


def seeded(reqs):
    return [dataclasses.replace(r, params=dataclasses.replace(r.params, seed=i)) for i, r in enumerate(reqs)]


def test_a_sized_cache_is_allocated_once_and_equals_the_dynamic_engine(monkeypatch):
    fake_device(monkeypatch, slots=100)
    model = tiny_model("qwen2")
    reqs = seeded(staggered_requests(7, temperature=0.8))
    want = run_sync(TorchEngine(model, eos_token_id=EOS), reqs)
    eng = sized_engine(model)
    cache = eng._runner.cache
    assert (cache.slots, cache.capacity, cache.generation) == (8, 64, 1)  # all of it, before any step
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    assert cache.generation == 1  # never reallocated
    assert {length for _, length in eng._runner.bucketed_decode.steps} == {64}  # min(128, capacity)
    eng.close()


def test_short_memory_lowers_the_sequences_run_at_once(monkeypatch, caplog):
    fake_device(monkeypatch, slots=3.5)
    model = tiny_model("llama")
    reqs = seeded(staggered_requests(7, temperature=1.0))
    want = run_sync(TorchEngine(model, EOS, settings_of(max_num_seqs=8)), reqs)
    with caplog.at_level(logging.WARNING, logger="asyncrl.rollout"):
        eng = sized_engine(model)
    lowered = [r.message for r in caplog.records if "gpu_memory_utilization" in r.message]
    assert len(lowered) == 1 and "holds 3 sequences of 64 tokens" in lowered[0]
    assert eng._runner.max_num_seqs == eng._scheduler.max_num_seqs == eng._runner.cache.slots == 3
    got = run_sync(eng, reqs)
    assert [o.response_ids for o in got] == [o.response_ids for o in want]  # seeded rows: batch-independent
    assert {size for size, _ in eng._runner.bucketed_decode.steps} <= {1, 2, 3}
    eng.close()


def test_no_room_for_one_sequence_raises_at_construction(monkeypatch):
    fake_device(monkeypatch, slots=0.9)
    with pytest.raises(ConfigError, match=r"^rollout.gpu_memory_utilization=0.5 leaves"):
        sized_engine(tiny_model())
    fake_device(monkeypatch, slots=1.0, fraction=0.25)
    assert sized_engine(tiny_model(), gpu_memory_utilization=0.25)._runner.max_num_seqs == 1
    with pytest.raises(ConfigError, match="gpu_memory_utilization=1.5"):
        sized_engine(tiny_model(), gpu_memory_utilization=1.5)


def test_a_request_longer_than_max_model_len_is_refused():
    eng = TorchEngine(tiny_model(), EOS, settings_of(max_model_len=20))
    with pytest.raises(RolloutError, match="needs 21 cached tokens .* max_model_len is 20; raise max_model_len"):
        run_sync(eng, [request("a", prompt(5, seed=0), 16)])
    assert run_sync(eng, [request("b", prompt(5, seed=0), 15)])[0].finish_reason == "length"
    eng.close()
