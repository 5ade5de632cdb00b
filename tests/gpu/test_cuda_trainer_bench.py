"""bench/trainer_throughput.py on CUDA at a tiny size (skipped without a GPU): the forward /
backward / optimizer split read from CUDA events, CUDA's peak memory, both MFUs on a GPU in the
peak table, and FlashAttention over the packed rows reported wherever torch has `varlen_attn`."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from asyncrl.telemetry.perf import peak_flops
from bench import trainer_throughput as bench

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_bench_default_runs_flash_and_times_the_step_from_cuda_events(tmp_path):
    out = tmp_path / "tt.jsonl"
    bench.run(bench.parse(["--device", "cuda", "--model", "tiny", "--dtype", "bfloat16", "--rows", "8",
                           "--prompt-len", "8,16", "--median", "24", "--max-row", "64", "--steps", "2",
                           "--configs", "packed", "--out", str(out)]))
    row = json.loads(out.read_text().splitlines()[1])
    assert row["status"] == "ran" and row["peak_memory_gb"] > 0
    assert row["backward_s_median"] > 0 and row["optimizer_s_median"] > 0 and row["forward_s_median"] > 0
    known = peak_flops(torch.cuda.get_device_name()) is not None
    assert (row["mfu_verl"] is not None) == (row["mfu_executed"] is not None) == known
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return  # torch before 2.10: the jagged or grouped path (issue 23)
    assert row["attention_path"] == "varlen", row["attention_calls"]
