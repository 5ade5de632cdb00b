"""Engine settings: `rollout.*` read once by the engine registry into a checked frozen value;
resolved defaults (model length, fixed-shape decode) follow the device and the KV budget."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.config.schema import RolloutConfig
from asyncrl.errors import ConfigError
from asyncrl.rollout import EngineSettings
from asyncrl.rollout.registry import engine_settings


def test_the_registry_reads_the_rollout_keys():
    cfg = RolloutConfig(kv_budget_tokens=4096, max_num_seqs=8, gpu_memory_utilization=0.3, cuda_graphs=True)
    cpu = engine_settings(cfg, device="cpu", seed=7)
    assert (cpu.kv_budget_tokens, cpu.max_num_seqs, cpu.gpu_memory_utilization, cpu.seed) == (4096, 8, 0.3, 7)
    assert cpu.model_len == 4096 and not cpu.decode_graphs  # graphs are for GPUs
    gpu = engine_settings(cfg, device="cuda:1", seed=7, max_model_len=1024)
    assert gpu.decode_graphs and gpu.model_len == 1024
    assert not engine_settings(dataclasses.replace(cfg, cuda_graphs=False), device="cuda", seed=0).decode_graphs


def test_defaults_resolve_by_device_and_budget():
    assert EngineSettings(device="cuda").decode_graphs and not EngineSettings().decode_graphs
    assert EngineSettings(device="cuda", static_decode=False).decode_graphs is False
    assert EngineSettings(kv_budget_tokens=100, max_model_len=500).model_len == 100  # one sequence fits the budget


def test_admission_waits_for_an_eighth_of_the_batch_on_cuda_only():
    assert EngineSettings(max_num_seqs=64).admit_free_slots == 1  # CPU: today's rule
    assert EngineSettings(max_num_seqs=64, device="cuda").admit_free_slots == 8
    assert EngineSettings(max_num_seqs=4, device="cuda:1").admit_free_slots == 1
    assert EngineSettings(max_num_seqs=64, admit_min_free_slots=100).admit_free_slots == 64  # capped
    assert EngineSettings(max_num_seqs=64, admit_min_free_slots=3, device="cuda").admit_free_slots == 3
    cfg = RolloutConfig(max_num_seqs=64, admit_min_free_slots=5)
    assert engine_settings(cfg, device="cpu", seed=0).admit_free_slots == 5


@pytest.mark.parametrize(("fields", "message"), [
    (dict(kv_budget_tokens=0), "kv_budget_tokens must be >= 1, got 0"),
    (dict(max_num_seqs=0), "max_num_seqs must be >= 1, got 0"),
    (dict(max_prefill_tokens=-1), "max_prefill_tokens must be >= 1, got -1"),
    (dict(max_model_len=0), "max_model_len must be >= 1, got 0"),
    (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization=0.0 must be in \(0, 1\]"),
    (dict(admit_min_free_slots=-1), r"admit_min_free_slots must be >= 0 \(0: auto\), got -1"),
])
def test_a_value_out_of_range_is_a_config_error_on_construction(fields, message):
    with pytest.raises(ConfigError, match=message):
        EngineSettings(**fields)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineSettings().max_num_seqs = 2  # type: ignore[misc]
