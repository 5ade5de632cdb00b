"""bench/gpu_engine.py's diagnostics on the CPU at a toy size: the floor and its kernel count are
the engine's own decode step (its forward as the run's settings built it, sampling included), the
own-mix floor counts only the last run's steps, and capture time means decode and prefill captures."""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from bench import engine_diag
from bench import gpu_engine as bench

TOY = ["--device", "cpu", "--skip-hf", "--num-requests", "4", "--prompt-min", "4", "--prompt-max", "8", "--median",
       "4", "--cap", "6", "--batches", "4", "--floor-iters", "2", "--floor-budget-s", "5", "--threads", "1"]


def one_batch(monkeypatch: pytest.MonkeyPatch, *extra: str) -> dict[str, Any]:
    monkeypatch.setattr(sys, "argv", ["gpu_engine.py", *TOY, *extra])
    args = bench.parse_args()
    device = torch.device("cpu")
    model = bench.build_model(args.model, device)
    compute = bench.compute_thread(1, "bench-test")
    try:
        return bench.one_batch(model, bench.workload(args, model.config.vocab_size), 4, device, args, compute)
    finally:
        compute.shutdown()


def test_the_floor_is_the_engines_own_step_and_the_own_mix_floor_counts_the_last_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    row = one_batch(monkeypatch, "--engine-runs", "2")
    assert row["own_mix_steps"] == row["decode_steps"] > 0  # not both runs' steps
    assert row["engine_vs_own_mix_floor"] > 0  # its size is a timing: the step counts above decide
    assert row["capture_s"] == 0.0
    # the engine's forward as the CPU resolves it, its graph key (bucket 4, the matmul path's length)
    assert row["floor_forward"] == {"fused": False, "attention": "matmul"}
    assert (row["floor_rows"], row["floor_key"][0], row["kernels_counted_on"]) == (4, 4, "eager step (CPU)")
    assert row["floor_key"][1] >= bench.mean_context(bench.workload(bench.parse_args(), 4096))
    assert row["aten_ops_per_decode_step"] > 0
    # the CPU's matmul path reads every row to its padded length
    assert row["kv_bytes_per_step_read"] == row["kv_bytes_per_step_padded"] > row["kv_bytes_per_step_real"] > 0


def test_capture_time_counts_prefill_graphs_too() -> None:
    def graphs(seconds: float) -> SimpleNamespace:
        return SimpleNamespace(capture_s=seconds, steps=Counter())

    runner = SimpleNamespace(bucketed_decode=graphs(1.5), bucketed_prefill=graphs(2.0))
    assert engine_diag.capture_seconds(runner) == 3.5


def test_kv_reads_count_real_and_padded_positions() -> None:
    reads = engine_diag.KVReads()
    reads.add([99, 299], bucket=2, capacity=2304)  # the docstring's example
    reads.add([5], bucket=1, capacity=64)  # the CPU's small cache caps the attention length
    assert (reads.steps, reads.real, reads.padded) == (2, 400 + 6, 1024 + 64)
    per_step = reads.bytes_per_step(bytes_per_token=2, reads_length=True)
    assert per_step == {"real": 406.0, "padded": 1088.0, "read": 406.0}
    assert reads.bytes_per_step(bytes_per_token=2, reads_length=False)["read"] == 1088.0
