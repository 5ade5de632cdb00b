"""backend=processes: the trainer and the rollout worker in spawned processes, weights through
one shared buffer (transport "ipc"), every sync verified bit for bit."""

from __future__ import annotations

import asyncio
import math
import os

import pytest

from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.pipelines import pipeline_module
from asyncrl.sync.rendezvous import is_loopback, tcp_listeners
from asyncrl.sync.transports import SharedBufferTransport
from asyncrl.training import fsdp
from tests.pipelines.helpers import make_context, read_jsonl

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pipeline, dtype", [("one_step_off", "float32"), ("fully_async", "bfloat16"),
                                             ("colocated", "float32")])
def test_pipelines_run_in_processes_with_verified_shared_buffer_syncs(tiny_cache, tmp_path, pipeline, dtype):
    ctx = make_context(tmp_path, "backend=processes", f"pipeline={pipeline}", f"model.dtype={dtype}",
                       "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false",
                       "rollout.num_cpus=1", "trainer.num_cpus=1")
    ctx.synchronizer.verify = True
    assert isinstance(ctx.synchronizer.transport, SharedBufferTransport)

    async def main():
        pids = {await ctx.trainer._caller.pid(), await ctx.rollout.workers[0]._caller.pid()}  # Proxy -> handle
        await pipeline_module(pipeline).run(ctx)
        return pids

    pids = asyncio.run(main())
    assert len(pids) == 2 and os.getpid() not in pids
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) >= 3 and ctx.synchronizer.transfers >= 2
    assert steps[-1]["sync/verify_s"] > 0


def test_a_sharded_trainer_of_two_ranks_trains_in_a_pipeline(tiny_cache, tmp_path):
    """trainer.ranks=2: two trainer processes in one gloo group, the actor sharded by FSDP2 across
    them; rank 0 fills the shared buffer with the full tensors both gathered."""
    ctx = make_context(tmp_path, "backend=processes", "pipeline=one_step_off", "trainer.ranks=2",
                       "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false",
                       "rollout.num_cpus=1", "trainer.num_cpus=1")
    ctx.synchronizer.verify = True
    group = ctx.trainer._caller  # Proxy -> RankGroup

    async def main():
        worlds = [await rank.run(fsdp.world) for rank in group.ranks]
        pids = [await h.pid() for h in [*group.ranks, ctx.rollout.workers[0]._caller]]
        exposed = [(pid, a, p) for pid in pids for a, p in tcp_listeners(pid) if not is_loopback(a)]
        await pipeline_module("one_step_off").run(ctx)
        return worlds, exposed

    worlds, exposed = asyncio.run(main())
    assert worlds == [(0, 2), (1, 2)]
    assert exposed == []  # the ranks met through a FileStore; gloo listens on loopback only
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) == 3 and ctx.synchronizer.transfers >= 2
    assert all(math.isfinite(r["actor/pg_loss"]) for r in steps)
    assert len(list(tmp_path.glob("**/actor_state.safetensors"))) == 1  # rank 0 wrote the full state, once


def test_trainer_ranks_need_the_processes_backend():
    with pytest.raises(ConfigError, match="trainer.ranks=2 needs backend=processes"):
        load_config(None, ["trainer.ranks=2"])
