"""topology: the devices each side gets and the shape of one modelled engine, at the configured
tensor-parallel size (the engine each server is built with) and at another (the TP planner)."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.config.schema import Config
from asyncrl.errors import ConfigError
from asyncrl.sim import costs
from asyncrl.sim.profile import Profile, load_profile
from asyncrl.sim.topology import devices, engine_shape, kv_capacity, with_memory_utilization
from asyncrl.sim.workers import SimRolloutServer
from asyncrl.sim.workload import Workload


def sim_cfg(*overrides: str) -> Config:
    return load_config(None, ["pipeline=colocated", "trainer.nnodes=1", "trainer.n_gpus_per_node=8",
                              "rollout.max_num_seqs=256", *overrides])


def built_shape(cfg: Config, p: Profile) -> tuple[tuple[float, float, float], float, float, int]:
    """The engine a server is built with, read back from its model."""
    m = SimRolloutServer(cfg, p, devices(cfg, p).per_engine, Workload(cfg, 0)).engine.model
    return (m.a, m.b, m.c), m.prefill, m.capacity, m.max_seqs


def test_engine_shape_at_the_configured_tp_is_the_built_engine() -> None:
    p = load_profile("h20-qwen2.5-7b")
    cfg = sim_cfg("rollout.tensor_model_parallel_size=2")
    shape = engine_shape(cfg, p, 2)
    built = (costs.decode_coefficients(p, 2), costs.prefill_s_per_token(p, 2), costs.kv_capacity_tokens(p, 2), 256)
    assert shape == built
    assert built_shape(cfg, p) == built


def test_a_cpu_engine_holds_the_real_engines_kv_budget() -> None:
    p = load_profile("cpu-tiny")
    cfg = load_config(None, ["num_threads=2", "rollout.kv_budget_tokens=5000"])
    assert kv_capacity(cfg, p, 2) == 5000
    assert built_shape(cfg, p)[2] == 5000
    assert engine_shape(cfg, p, cfg.rollout.tensor_model_parallel_size)[2] == 5000


def test_engine_shape_is_a_share_of_a_larger_engine_or_several_smaller_ones() -> None:
    p = load_profile("h20-qwen2.5-7b")
    cfg = sim_cfg("rollout.tensor_model_parallel_size=2")
    (a, b, c), prefill, capacity, seqs = engine_shape(cfg, p, 4)  # each 2-GPU server: half a TP-4 engine
    # TP 4: speed 4 x 0.85^2 = 2.89; KV (4 x 96e9 x 0.85 - 7.62e9 x 2) / 57344 = 5,426,199 tokens
    bw = 4000e9 * p.mem_bw_eff * 2.89
    assert a == pytest.approx(p.decode_step_s + 15.24e9 / bw, rel=1e-9, abs=1e-12)
    assert b == pytest.approx(2 * 2 * 7.62e9 / (148e12 * 2.89 * p.decode_mfu), rel=1e-9, abs=1e-12)
    assert c == pytest.approx(2 * 57344 / bw, rel=1e-9, abs=1e-15)
    assert prefill == pytest.approx(2 * 2 * 7.62e9 / (148e12 * 2.89 * p.prefill_mfu), rel=1e-9, abs=1e-12)
    assert capacity == pytest.approx(5_426_199 / 2, rel=0, abs=1)
    assert seqs == 128
    (_, b1, _), _, capacity1, seqs1 = engine_shape(cfg, p, 1)  # each server: 2 engines of 1 GPU
    # TP 1: KV (96e9 x 0.85 - 15.24e9) / 57344 = 1,157,226 tokens per engine
    assert b1 == pytest.approx(2 * 7.62e9 / (148e12 * p.decode_mfu) / 2, rel=1e-9, abs=1e-12)
    assert capacity1 == pytest.approx(2 * 1_157_226, rel=0, abs=2)
    assert seqs1 == 512


def test_gpu_memory_utilization_sets_the_modelled_kv_capacity() -> None:
    p = load_profile("h20-qwen2.5-7b")
    assert with_memory_utilization(p, 0.0) is p
    raised = with_memory_utilization(p, 0.9)
    # (4 x 96 GB x 0.9 - 15.24 GB of weights) / 57344 B per token
    assert costs.kv_capacity_tokens(raised, 4) == pytest.approx((4 * 96e9 * 0.9 - 15.24e9) / 57344, rel=1e-6, abs=1)
    with pytest.raises(ConfigError, match="sim.gpu_memory_utilization"):
        with_memory_utilization(p, 1.5)
