"""Compiled decoder layers on CUDA (`actor.use_torch_compile`, skipped without a GPU): in bf16 the
packed rows still run FlashAttention's varlen kernel (eagerly: the one graph break per layer),
inductor compiles the rest of the layer, new packed lengths recompile nothing, and the compiled
update's log-probs track the eager one's."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.training import packed_attention
from asyncrl.training.actor import Actor
from asyncrl.training.compile import compile_layers, compile_metrics
from tests.gpu.test_cuda_training import expected_path, qwen2_small
from tests.training.helpers import groups_of_lengths
from tests.training.test_packing import spread_groups, train_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def actor(compiled: bool) -> Actor:
    cfg = ActorConfig(ppo_micro_batch_tokens=4096, lr=1e-3, warmup_steps=0)
    return Actor(compile_layers(qwen2_small(), compiled), cfg, temperature=1.0, norm_length=64,
                 compute_dtype=torch.bfloat16)


def test_compiled_layers_run_the_flash_path_and_break_only_around_attention():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # graph breaks are counted when a frame compiles: compile here, whatever ran before
    counters["graph_break"].clear()
    a = actor(True)
    runs = expected_path("auto", torch.bfloat16)
    packed_attention.PATHS.clear()
    reports = []
    for i, responses in enumerate([[[60, 1, 3], [2, 35]], [[9, 4, 48, 1], [17]], [[5, 5], [120, 7, 2]]]):
        a.train_step(train_batch(groups_of_lengths([3, 8], responses, seed=i)).to(torch.device("cuda")), 1)
        reports.append(compile_metrics(a.model))
    assert set(packed_attention.PATHS) == {runs}  # FlashAttention varlen where this torch has it
    assert [r["perf/recompiles"] for r in reports[1:]] == [0, 0]
    breaks = {reason: n for reason, n in counters["graph_break"].items()}
    print("graph breaks:", breaks, "compile:", reports[0])
    assert breaks and all("disable" in reason for reason in breaks), breaks  # packed_attention's, no other


def test_compiled_log_probs_track_eager_in_bf16():
    batch = train_batch(spread_groups()).to(torch.device("cuda"))
    eager, compiled = (actor(c).compute_log_probs(batch) for c in (False, True))
    mask = batch.response_mask.bool()
    torch.testing.assert_close(compiled[mask], eager[mask], rtol=0.05, atol=0.05)  # bf16 matmuls, as test_precision
