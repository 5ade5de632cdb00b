"""A soak test: 1,000 updates of the fully async pipeline (mode (d): staleness and partial rollout)
on the simulator, checking that nothing grows with the run's length: Python memory, the queue,
the rollouter's groups in flight, asyncio tasks and threads; and that every prompt is trained
once per epoch over the ~31 epochs the run spans, none twice.

Memory is tracemalloc's traced size after a full collection, sampled every 100 updates from a
wrapped `after_step` (the trace is capped at a few hundred spans so it is full before the first
sample; metrics and the ledger go to files). From update 200 to 1,000 it may grow by 256 KiB
(it moves by ~25 KiB here); keeping every finished group adds ~4.6 KB per update (~3.7 MB).
"""

import asyncio
import gc
import json
import threading
import tracemalloc
from collections import Counter

import pytest

import asyncrl.pipelines.fully_async as fully_async
from asyncrl.config import load_config
from asyncrl.sim.run import simulate

UPDATES, R, T, THRESHOLD, TASK_SIZE = 1000, 2, 2, 0.5, 64  # R = require_batches x ppo_mini_batch_size
PER_VERSION = int((1 + THRESHOLD) * R * T)  # the rollouter's budget per policy version
CAPACITY = 2 * PER_VERSION  # the queue's bound (fully_async._loop)
SAMPLE_EVERY = 100
SOAK = ["pipeline=fully_async", "data.train_batch_size=4", f"actor.ppo_mini_batch_size={R}", "rollout.n=2",
        "async_training.require_batches=1", f"async_training.trigger_parameter_sync_step={T}",
        f"async_training.staleness_threshold={THRESHOLD}", "async_training.partial_rollout=true",
        f"rollout.total_rollout_steps={UPDATES * R}", "data.max_response_length=1024", "sim.length_median=100",
        "rollout.tensor_model_parallel_size=1", "rollout.nnodes=1", "rollout.n_gpus_per_node=2",
        "trainer.nnodes=1", "trainer.n_gpus_per_node=2", "trainer.test_freq=0", "trainer.logger=[jsonl]",
        f"data.task_size={TASK_SIZE}", "data.val_size=4", "sim.trace_max_events=500"]


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    """Run once: the most asyncio tasks after any update (a running max, so the probe itself
    keeps nothing per update), memory every SAMPLE_EVERY-th, and the outputs."""
    out = tmp_path_factory.mktemp("soak")
    memory: dict[int, int] = {}
    most_tasks = 0
    after_step = fully_async.after_step

    async def sampled(ctx, step, metrics, groups, **kwargs):
        nonlocal most_tasks
        await after_step(ctx, step, metrics, groups, **kwargs)
        most_tasks = max(most_tasks, len(asyncio.all_tasks()))
        if step % SAMPLE_EVERY == 0:
            gc.collect()
            memory[step] = tracemalloc.get_traced_memory()[0]

    threads = threading.active_count()
    tracing = tracemalloc.is_tracing()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fully_async, "after_step", sampled)
        tracemalloc.start()
        try:
            summary = simulate(load_config(None, [*SOAK, f"trainer.output_dir={out}"]), log=lambda _: None)
        finally:
            if not tracing:
                tracemalloc.stop()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"out": out, "summary": summary, "memory": memory, "most_tasks": most_tasks,
            "threads": (threads, threading.active_count()), "steps": [r for r in rows if "timing_s/step" in r]}


def test_the_run_trains_every_update_off_policy_with_partial_rollouts(soak):
    assert [r["training/global_step"] for r in soak["steps"]] == list(range(1, UPDATES + 1))
    assert soak["summary"].partial_ratio > 0 and soak["summary"].version_lag_max >= 1


def test_python_memory_stays_flat(soak):
    memory = soak["memory"]
    trace = json.loads((soak["out"] / "trace.json").read_text())
    assert trace["otherData"]["dropped_events"] > 0  # the trace's own (bounded) growth is over early on
    assert sorted(memory) == list(range(SAMPLE_EVERY, UPDATES + 1, SAMPLE_EVERY))
    growth = {step: size - memory[200] for step, size in memory.items() if step >= 200}
    assert max(growth.values()) < 256 * 1024, " ".join(f"{s}:{g / 1024:+.0f}KiB" for s, g in growth.items())


def test_queue_and_groups_in_flight_stay_within_their_bounds(soak):
    steps = soak["steps"]
    sizes = [r["fully_async/queue/size"] for r in steps]
    assert max(sizes) <= steps[-1]["fully_async/queue/max_size"] <= CAPACITY
    assert max(sizes[UPDATES // 2:]) <= max(sizes[:UPDATES // 2])
    assert max(r["rollouter/in_flight"] for r in steps) <= PER_VERSION


def test_no_tasks_or_threads_pile_up(soak):
    assert soak["most_tasks"] <= PER_VERSION + 8  # groups in flight, the two loops, a few wake-ups
    before, after = soak["threads"]
    assert after == before


def test_every_prompt_is_trained_once_per_epoch(soak):
    ledger = [json.loads(line) for line in (soak["out"] / "samples.jsonl").read_text().splitlines()]
    assert len(ledger) == UPDATES * R and len({s["uid"] for s in ledger}) == UPDATES * R
    assert set(Counter(s["step"] for s in ledger).values()) == {R}
    epochs, extra = divmod(UPDATES * R, TASK_SIZE)  # 31 whole epochs and the start of one more
    times_trained = Counter(Counter(s["prompt"] for s in ledger).values())
    assert times_trained == {epochs + 1: extra, epochs: TASK_SIZE - extra}
