"""The local substrate's threads (asyncrl.compute): a colocated run's engines and trainer step on
one compute thread, a decoupled run has one per side, and the loop's thread runs torch
single-threaded, so the process keeps one OpenMP team per side."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.scheduling.plan import plan_run
from asyncrl.substrates.local import LocalSubstrate
from asyncrl.types import GenerationRequest, SamplingParams
from asyncrl.workers.handles import _worker_thread, blocking, share_worker_thread


class _Probe:
    """A `@blocking` worker sharing the trainer's thread, reporting where it runs."""

    @blocking
    def where(self) -> tuple[int, int]:
        return threading.get_ident(), torch.get_num_threads()


def _step_thread(engine) -> tuple[int, int]:
    """The thread the engine steps on and its torch threads, read through a generation."""
    seen: list[tuple[int, int]] = []
    run = engine._runner.run

    def spy(plan):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return run(plan)

    engine._runner.run = spy
    request = GenerationRequest("r", (5, 6, 7), SamplingParams(max_tokens=2, ignore_eos=True))
    asyncio.run(engine.generate(request))
    engine._runner.run = run
    return seen[0]


@pytest.mark.parametrize("pipeline", ["colocated", "one_step_off"])
def test_compute_threads_per_side(pipeline):
    before = torch.get_num_threads()
    cfg = load_config(overrides=[f"pipeline={pipeline}", "num_threads=2", "rollout.num_cpus=1",
                                 "trainer.num_cpus=2", "data.task_size=64", "data.val_size=4"])
    substrate = LocalSubstrate()
    try:
        substrate.load_data(cfg, lambda _: None)
        workers = substrate.build_workers(cfg, plan_run(cfg), lambda _: None)
        assert torch.get_num_threads() == 1, "the loop's thread runs torch single-threaded"
        engine_thread = _step_thread(workers.rollouts[0].engine)
        probe = _Probe()
        share_worker_thread(probe, _worker_thread(workers.trainer))
        trainer_thread = asyncio.run(probe.where())
        if pipeline == "colocated":
            assert engine_thread == trainer_thread == (engine_thread[0], 2)
        else:
            assert engine_thread[0] != trainer_thread[0]
            assert (engine_thread[1], trainer_thread[1]) == (1, 2)
        workers.close()
    finally:
        torch.set_num_threads(before)
