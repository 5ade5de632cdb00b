"""Engine settings: `rollout.*` read once, under the key's own name, and resolved for the device
in one place (`engine_settings`); defaults and ranges are the config's alone."""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from typing import Any

import pytest
import torch

import asyncrl.rollout.settings as settings_module
from asyncrl.config.schema import MultiTurnConfig, RolloutConfig
from asyncrl.errors import ConfigError
from asyncrl.rollout import EngineSettings, TorchEngine, engine_settings
from asyncrl.rollout.generic import build_forward
from asyncrl.rollout.memory import plan_kv_cache
from asyncrl.rollout.scheduler import Scheduler
from tests.rollout.rollout_testlib import EOS, tiny_model

ROLLOUT_KEYS = {f.name for f in dataclasses.fields(RolloutConfig)}
SETTINGS = {f.name for f in dataclasses.fields(EngineSettings)}
DERIVED = {"multi_turn": "prefix_cache"}
"""The one setting not named after its key: a multi-turn run keeps finished turns' K/V."""


def recording(cls: type, reads: Counter[str], **values: Any) -> Any:
    """An instance of a subclass of the frozen dataclass `cls` that counts its attribute reads."""

    class Recording(cls):  # type: ignore[misc, valid-type]
        def __getattribute__(self, name: str) -> Any:
            if not name.startswith("_"):
                reads[name] += 1
            return super().__getattribute__(name)

    return Recording(**values)


def test_each_rollout_key_is_read_once_under_its_own_name(monkeypatch):
    reads: Counter[str] = Counter()
    cfg = recording(RolloutConfig, reads)
    monkeypatch.setattr(settings_module, "check_fields", lambda node, prefix: None)  # it reads every key
    for device in ("cpu", "cuda"):
        reads.clear()
        settings = engine_settings(cfg, device=device)
        assert set(reads) <= ROLLOUT_KEYS and all(n == 1 for n in reads.values()), reads
        assert {DERIVED.get(key, key) for key in reads} <= SETTINGS  # the engine's name is the key's
        assert (SETTINGS & ROLLOUT_KEYS) | set(DERIVED) == set(reads)  # no setting bypasses its key
        assert settings.cuda_graphs is (device == "cuda")


def test_the_engine_reads_every_setting():
    reads: Counter[str] = Counter()
    values = dataclasses.asdict(engine_settings(RolloutConfig(max_num_seqs=4), seed=0))
    values["device"] = torch.device("cpu")
    TorchEngine(tiny_model(), EOS, recording(EngineSettings, reads, **values)).close()
    assert set(reads) == SETTINGS, SETTINGS - set(reads)  # none is dead, none renamed on the way


@pytest.mark.parametrize(("key", "consumer"), [
    ("decode_attention", build_forward), ("fused_decode", build_forward), ("max_num_seqs", Scheduler),
    ("kv_budget_tokens", Scheduler), ("admit_min_free_slots", Scheduler), ("gpu_memory_utilization", plan_kv_cache),
])
def test_the_code_a_setting_reaches_takes_the_keys_name(key, consumer):
    assert key in inspect.signature(consumer).parameters


def test_no_default_or_range_is_stated_twice():
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(EngineSettings))
    default = engine_settings()
    assert (default.kv_budget_tokens, default.max_num_seqs) == (RolloutConfig.kv_budget_tokens,
                                                                RolloutConfig.max_num_seqs)
    with pytest.raises(ConfigError, match=r"rollout.max_num_seqs=0 is out of range: set rollout.max_num_seqs >= 1"):
        engine_settings(RolloutConfig(max_num_seqs=0))


def test_the_settings_resolve_the_rollout_keys_by_device():
    cfg = RolloutConfig(kv_budget_tokens=4096, max_num_seqs=8, gpu_memory_utilization=0.3, cuda_graphs=True)
    cpu = engine_settings(cfg, device="cpu", seed=7)
    assert (cpu.kv_budget_tokens, cpu.max_num_seqs, cpu.gpu_memory_utilization, cpu.seed) == (4096, 8, 0.3, 7)
    assert cpu.max_model_len == 4096 and not cpu.cuda_graphs  # graphs are for GPUs
    gpu = engine_settings(cfg, device="cuda:1", seed=7, max_model_len=1024)
    assert gpu.cuda_graphs and gpu.max_model_len == 1024
    assert not engine_settings(dataclasses.replace(cfg, cuda_graphs=False), device="cuda").cuda_graphs
    assert engine_settings(RolloutConfig(kv_budget_tokens=100), max_model_len=500).max_model_len == 100
    assert not engine_settings(cfg).prefix_cache
    assert engine_settings(RolloutConfig(multi_turn=MultiTurnConfig(enable=True))).prefix_cache


@pytest.mark.parametrize(("keys", "device", "free_slots"), [
    (dict(max_num_seqs=64), "cpu", 1),  # CPU: today's rule
    (dict(max_num_seqs=64), "cuda", 8),
    (dict(max_num_seqs=4), "cuda:1", 1),
    (dict(max_num_seqs=64, admit_min_free_slots=100), "cpu", 64),  # capped
    (dict(max_num_seqs=64, admit_min_free_slots=3), "cuda", 3),
    (dict(max_num_seqs=64, admit_min_free_slots=5), "cpu", 5),
])
def test_admission_waits_for_an_eighth_of_the_batch_on_cuda_only(keys, device, free_slots):
    assert engine_settings(RolloutConfig(**keys), device=device).admit_min_free_slots == free_slots


@pytest.mark.parametrize(("keys", "arguments", "message"), [
    (dict(kv_budget_tokens=0), {}, "rollout.kv_budget_tokens=0 is out of range"),
    (dict(max_num_seqs=0), {}, "rollout.max_num_seqs=0 is out of range"),
    ({}, dict(max_prefill_tokens=-1), "max_prefill_tokens must be >= 1, got -1"),
    ({}, dict(max_model_len=0), "max_model_len must be >= 1, got 0"),
    (dict(gpu_memory_utilization=0.0), {}, r"rollout.gpu_memory_utilization=0.0 is out of range: .* in \(0, 1\]"),
    (dict(admit_min_free_slots=-1), {}, r"rollout.admit_min_free_slots=-1 is out of range: .* >= 0 \(0 picks it"),
])
def test_a_value_out_of_range_is_a_config_error_naming_its_key(keys, arguments, message):
    with pytest.raises(ConfigError, match=message):
        engine_settings(RolloutConfig(**keys), **arguments)
    with pytest.raises(dataclasses.FrozenInstanceError):
        engine_settings().max_num_seqs = 2  # type: ignore[misc]
