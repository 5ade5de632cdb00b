"""perf/* metrics against hand computation: verl's FLOPs estimate, MFU on a known GPU (none on
a CPU or an unknown GPU), throughput per device, memory, and the keys a trainer step adds."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from asyncrl.config.schema import ActorConfig, AlgorithmConfig, Config
from asyncrl.telemetry.perf import (
                                    ModelShape,
                                    actor_mfu,
                                    dense_params,
                                    executed_training_flops,
                                    memory_metrics,
                                    peak_flops,
                                    run_devices,
                                    seq_lens_of,
                                    step_perf,
                                    throughput_metrics,
                                    training_flops,
)
from asyncrl.training.actor import Actor
from asyncrl.workers.trainer import PPOTrainer
from tests.training.helpers import make_groups, tiny_lm

SHAPE = ModelShape(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=2,
                   head_dim=4, vocab_size=10)


def test_flops_follow_verls_estimate():
    # per layer: mlp 3 x 8 x 16 = 384, q/k/v/o 8 x (8 + 8 + 8 + 8) = 256; 2 layers + 2 x 10 x 8
    assert dense_params(SHAPE) == 2 * (384 + 256) + 160
    # 6 x 1440 x (3 + 5) + 12 x (9 + 25) x 4 x 2 x 2
    assert training_flops(SHAPE, [3, 5]) == pytest.approx(69120 + 6528, rel=1e-12, abs=1e-9)


def test_executed_flops_skip_the_embedding_and_count_the_head_on_responses_only():
    # layers 6 x 1280 x 8, head 6 x 10 x 8 x (1 + 2), causal pairs 3*4/2 + 5*6/2 = 21: 12 x 21 x 4 x 2 x 2
    assert executed_training_flops(SHAPE, [3, 5], [1, 2]) == pytest.approx(61440 + 1440 + 4032, rel=1e-12, abs=1e-9)
    # checkpointing recomputes the layers' forward (8 per parameter-token), not the head
    assert executed_training_flops(SHAPE, [3, 5], [1, 2], recompute=True) == pytest.approx(
        81920 + 1440 + 5376, rel=1e-12, abs=1e-9)


def test_grouped_query_attention_counts_fewer_kv_parameters():
    gqa = ModelShape(hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=4, vocab_size=10)
    assert dense_params(gqa) == 384 + 8 * (8 + 4 + 4 + 8) + 160


def test_model_shape_from_an_hf_config():
    shape = ModelShape.from_hf(tiny_lm().config)
    assert shape == ModelShape(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=8, vocab_size=32, tied_embeddings=True)
    assert ModelShape.from_hf(None) is None


@pytest.mark.parametrize(("name", "want"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12), ("NVIDIA H20", 148e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H800", 989e12), ("NVIDIA GeForce GTX 1080", None)])
def test_peak_flops_table(name, want):
    assert peak_flops(name) == want


def test_mfu_on_a_known_gpu_only():
    # 75648 FLOPs x 2 epochs in 1e-9 s on one H100: 1.51296e14 / 9.89e14
    got = actor_mfu(SHAPE, [3, 5], 1e-9, 2, "NVIDIA H100 80GB HBM3")
    assert got["perf/mfu/actor"] == pytest.approx(151296 / 1e-9 / 989e12, rel=1e-9, abs=1e-12)
    assert actor_mfu(SHAPE, [3, 5], 1e-9, 2, None) == {}  # CPU: no standard peak
    assert actor_mfu(SHAPE, [3, 5], 1e-9, 2, "Some GPU") == {}
    assert actor_mfu(None, [3, 5], 1e-9, 2, "NVIDIA H100") == {}


def test_throughput_is_tokens_per_second_per_device():
    got = throughput_metrics([100, 300], step_s=2.0, n_devices=4)
    assert got == pytest.approx({"perf/total_num_tokens": 400.0, "perf/time_per_step": 2.0,
                                 "perf/throughput": 50.0}, rel=1e-12, abs=1e-12)


def test_step_perf_counts_prompt_and_response_tokens_of_trained_groups():
    groups = make_groups(2, 3)
    lens = seq_lens_of(groups)
    assert lens == [len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories]
    got = step_perf({"timing_s/step": 0.5}, groups, n_devices=1)
    assert got["perf/total_num_tokens"] == sum(lens)
    assert got["perf/throughput"] == pytest.approx(sum(lens) / 0.5, rel=1e-12, abs=1e-12)
    assert step_perf({}, groups, 1) == {} and step_perf({"timing_s/step": 1.0}, [], 1) == {}


def test_run_devices():
    assert run_devices(Config()) == 1  # CPU
    cfg = Config()
    trainer, rollout = replace(cfg.trainer, n_gpus_per_node=4), replace(cfg.rollout, nnodes=2, n_gpus_per_node=2)
    assert run_devices(replace(cfg, pipeline="one_step_off", trainer=trainer, rollout=rollout)) == 8
    assert run_devices(replace(cfg, trainer=trainer, rollout=rollout)) == 4  # colocated: the same GPUs


def test_cpu_memory_is_the_process_rss():
    got = memory_metrics(torch.device("cpu"))
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB the process touches
    after = memory_metrics(torch.device("cpu"))
    assert after["perf/max_memory_allocated_gb"] > 0.05 and after["perf/cpu_memory_used_gb"] > 0.05
    assert after["perf/max_memory_allocated_gb"] >= got["perf/max_memory_allocated_gb"]
    assert after["perf/cpu_memory_used_gb"] - got["perf/cpu_memory_used_gb"] > 0.05  # GiB
    assert "perf/max_memory_reserved_gb" not in after
    del held


def test_a_trainer_step_reports_memory_and_no_mfu_on_cpu():
    actor = Actor(tiny_lm(), ActorConfig(warmup_steps=0, ppo_mini_batch_size=2), temperature=1.0, norm_length=4)
    metrics = asyncio.run(PPOTrainer(actor, AlgorithmConfig(), pad_id=0).train_groups(make_groups(2, 3)))
    assert metrics["perf/max_memory_allocated_gb"] > 0 and metrics["perf/cpu_memory_used_gb"] > 0
    assert "perf/mfu/actor" not in metrics
