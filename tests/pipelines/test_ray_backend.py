"""backend=ray puts the rollout host and the trainer in their own processes."""

from __future__ import annotations

import asyncio
import os

import pytest

from asyncrl.pipelines import fully_async
from tests.pipelines.helpers import make_context, read_jsonl

pytestmark = pytest.mark.slow


def test_workers_live_in_separate_processes(tiny_cache, ray_cluster, tmp_path):
    ctx = make_context(tmp_path, "backend=ray", "pipeline=fully_async", "rollout.total_rollout_steps=16",
                       "trainer.val_before_train=false", "trainer.test_freq=0")

    async def main():
        pids = {await ctx.trainer._caller.pid(), await ctx.rollout.workers[0]._caller.pid()}  # Proxy -> RayHandle
        await fully_async.run(ctx)
        return pids

    pids = asyncio.run(main())
    assert len(pids) == 2 and os.getpid() not in pids
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 16
