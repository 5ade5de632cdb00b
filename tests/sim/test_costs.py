import dataclasses

import numpy as np
import pytest

from asyncrl.sim import costs
from asyncrl.sim.profile import builtin_profiles, load_profile

# A round-number profile: 1 TFLOP/s, 1000 GB/s, a 1B model of 2 layers x hidden 10.
P = dataclasses.replace(
    load_profile("h20-qwen2.5-7b"), device_tflops=1.0, device_mem_gb=10.0, mem_bw_gb_s=1000.0, params_b=1.0,
    n_layers=2, hidden=10, kv_bytes_per_token=1000.0, bytes_per_param=2.0, decode_step_s=0.001, decode_mfu=0.5,
    mem_bw_eff=0.5, prefill_mfu=0.5, tp_efficiency=0.5, gpu_memory_utilization=0.5, train_mfu=0.5,
    logprob_mfu=0.5, micro_batch_s=0.1, logprob_pass_s=1.0, optimizer_step_s=0.2, sequence_parallel=1)


def test_decode_coefficients_by_hand():
    # tp=1: speed 1; bw = 1000e9 * 0.5 = 5e11 B/s; flops 1e12
    a, b, c = costs.decode_coefficients(P, 1)
    assert a == pytest.approx(0.001 + 2e9 / 5e11, rel=1e-12, abs=0)  # 5 ms
    assert b == pytest.approx(2e9 / 0.5e12, rel=1e-12, abs=0)  # 4 ms per sequence
    assert c == pytest.approx(1000 / 5e11, rel=1e-12, abs=0)  # 2 ns per cached token
    # tp=2 with efficiency 0.5 per doubling: speed 2 * 0.5 = 1, so the same as tp=1
    assert costs.decode_coefficients(P, 2) == pytest.approx((a, b, c), rel=1e-12, abs=0)


def test_kv_capacity_and_prefill():
    # 10 GB * 0.5 - 2 GB of weights = 3 GB / 1000 B
    assert costs.kv_capacity_tokens(P, 1) == 3_000_000
    assert costs.prefill_s_per_token(P, 1) == pytest.approx(2e9 / 0.5e12, rel=1e-12, abs=0)


def test_balance_worked_example():
    work, tokens = costs.balance(np.array([5.0, 4, 3, 2, 1]), np.array([5.0, 4, 3, 2, 1]), 2)
    assert sorted(work.tolist()) == [7.0, 8.0]
    assert tokens.sum() == 15


def test_logprob_and_update_seconds_by_hand():
    lengths = np.array([100, 100])
    flops = 2e9 * 100 + 2 * 2 * 10 * 100**2  # per sequence
    one_rank = 2 * flops / (1e12 * 0.5)
    micro = 1 * 0.1  # 200 tokens fit in one micro-batch of 1000
    assert costs.logprob_seconds(P, lengths, 1, 1000) == pytest.approx(1.0 + one_rank + micro, rel=1e-12, abs=0)
    # two devices: one sequence each
    assert costs.logprob_seconds(P, lengths, 2, 1000) == pytest.approx(1.0 + one_rank / 2 + micro, rel=1e-12, abs=0)
    update = costs.update_seconds(P, [lengths[:1], lengths[1:]], 1, 1000, epochs=2)
    assert update == pytest.approx(2 * 2 * (3 * flops / 0.5e12 + 0.1 + 0.2), rel=1e-12, abs=0)


def test_builtin_profiles_load():
    assert {"h20-qwen2.5-7b", "cpu-tiny"} <= set(builtin_profiles())
    for name in builtin_profiles():
        assert load_profile(name).params_b > 0
