"""The built-in H800 profiles for RollPacker's settings load, and `asyncrl sim` runs on each."""

from __future__ import annotations

import json

import pytest

from asyncrl.cli import main
from asyncrl.sim import costs
from asyncrl.sim.profile import builtin_profiles, load_profile

# (profile, nodes of 8 GPUs, max response length, rollout TP): 7B/8K on 16, 14B/16K on 32, 32B/32K on 64
SETTINGS = [("h800-qwen2.5-7b", 2, 8192, 2), ("h800-qwen2.5-14b", 4, 16384, 4), ("h800-qwen2.5-32b", 8, 32768, 8)]


@pytest.mark.parametrize("name, layers, kv_heads, params_b", [
    ("h800-qwen2.5-7b", 28, 4, 7.62), ("h800-qwen2.5-14b", 48, 8, 14.7), ("h800-qwen2.5-32b", 64, 8, 32.5)])
def test_physical_numbers(name, layers, kv_heads, params_b):
    p = load_profile(name)
    assert name in builtin_profiles() and p.name == name
    assert (p.device_tflops, p.device_mem_gb, p.mem_bw_gb_s) == (989.0, 80.0, 3350.0)
    assert (p.n_layers, p.params_b) == (layers, params_b)
    assert p.kv_bytes_per_token == 2 * layers * kv_heads * 128 * 2  # K and V, bf16, head_dim 128
    h20 = load_profile("h20-qwen2.5-7b")
    assert (p.decode_mfu, p.prefill_mfu, p.train_mfu, p.tp_efficiency) == \
        (h20.decode_mfu, h20.prefill_mfu, h20.train_mfu, h20.tp_efficiency)  # carried over


def test_kv_capacity_of_the_largest_engine_by_hand():
    # 32B at TP 8: (8 x 80e9 x 0.85 - 32.5e9 x 2) / (2 x 64 x 8 x 128 x 2) = 479e9 / 262144 tokens
    assert costs.kv_capacity_tokens(load_profile("h800-qwen2.5-32b"), 8) == pytest.approx(
        479e9 / 262144, rel=0, abs=1)


@pytest.mark.parametrize("name, nodes, max_response, tp", SETTINGS)
def test_sim_runs_two_colocated_steps(tmp_path, name, nodes, max_response, tp):
    assert main(["sim", f"sim.profile={name}", "pipeline=colocated", f"trainer.nnodes={nodes}",
                 "trainer.n_gpus_per_node=8", f"rollout.tensor_model_parallel_size={tp}",
                 f"data.max_response_length={max_response}", "data.train_batch_size=16", "rollout.n=4",
                 "actor.ppo_mini_batch_size=8", "trainer.total_training_steps=2", "trainer.test_freq=0",
                 "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.output_dir={tmp_path}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    assert len(steps) == 2 and all(r["timing_s/gen"] > 0 and r["timing_s/update_actor"] > 0 for r in steps)
