"""The TP planner in a run: per-step preemptions from the rollout side's cumulative counter, the
plan in the step's metrics, and a new TP applied to the simulator's engines (the real CPU
engine only reports it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from asyncrl.config import load_config
from asyncrl.pipelines.batch_source import batch_source
from asyncrl.pipelines.planning import Planner
from asyncrl.scheduling.tp_planner import TPPlanner
from asyncrl.sim.profile import load_profile, save_profile
from asyncrl.sim.run import simulate


class CountingRollout:
    """A rollout side whose cumulative preemption counter the test sets; records TP changes."""

    def __init__(self) -> None:
        self.preemptions = 0
        self.tp_calls: list[int] = []

    async def stats(self) -> dict[str, float]:
        return {"rollouter/preemptions": float(self.preemptions)}

    async def set_tensor_parallel(self, tp: int) -> None:
        self.tp_calls.append(tp)


class FixedRollout:
    """A rollout side that cannot change TP (like the CPU torch engine)."""

    async def stats(self) -> dict[str, float]:
        return {"rollouter/preemptions": 7.0}


def test_after_step_takes_per_step_deltas_and_applies_changes():
    rollout, logs = CountingRollout(), []
    planner = Planner(TPPlanner(1, growth=1.05, calm_steps=2, max_tp=8, gpus_per_node=4), logs.append)
    plans = []
    for cumulative in [0, 3, 6, 10, 20, 20, 20]:  # per step: 0 3 3 4 10 0 0 (the docstring example)
        metrics = {"rollouter/preemptions": float(cumulative)}
        plans.append(asyncio.run(planner.after_step(rollout, metrics)))
    assert plans == [1, 2, 2, 4, 4, 4, 2]
    assert metrics == {"rollouter/preemptions": 20.0, "rollout/preemptions_step": 0.0, "rollout/tp_size": 2.0}
    assert rollout.tp_calls == [2, 4, 2]  # only changes are applied
    assert logs == ["tp_planner: rollout tensor parallelism 1 -> 2", "tp_planner: rollout tensor parallelism 2 -> 4",
                    "tp_planner: rollout tensor parallelism 4 -> 2"]


def test_without_the_counter_in_metrics_it_asks_the_rollout_side_and_reports_only_once():
    logs: list[str] = []
    planner = Planner(TPPlanner(2), logs.append)
    first: dict[str, float] = {}
    assert asyncio.run(planner.after_step(FixedRollout(), first)) == 4
    assert first == {"rollout/preemptions_step": 7.0, "rollout/tp_size": 4.0}
    asyncio.run(planner.after_step(FixedRollout(), {}))
    assert len(logs) == 1 and "reports the planned size only" in logs[0]


def test_from_config_is_none_unless_enabled_and_reads_the_node_size():
    assert Planner.from_config(load_config(None, [])) is None
    cfg = load_config(None, ["tp_planner.enable=true", "tp_planner.max_tp=4", "rollout.tensor_model_parallel_size=2",
                             "pipeline=colocated", "trainer.n_gpus_per_node=8"])
    planner = Planner.from_config(cfg)
    assert planner is not None
    p = planner.policy
    assert (p.tp, p.growth, p.calm_steps, p.max_tp, p.gpus_per_node) == (2, 1.05, 4, 4, 8)


# ---- the simulator: a colocated run whose engines run out of KV cache ----------------------

SIM = ["pipeline=colocated", "data.train_batch_size=32", "actor.ppo_mini_batch_size=8", "rollout.n=4",
       "data.max_response_length=4096", "rollout.tensor_model_parallel_size=1", "trainer.nnodes=1",
       "trainer.n_gpus_per_node=8", "trainer.total_training_steps=3", "trainer.test_freq=0",
       "trainer.val_before_train=false", "trainer.logger=[jsonl]", "sim.length_median=1500", "data.val_size=8",
       "tp_planner.enable=true"]


def small_memory_profile(tmp_path):
    """h20-qwen2.5-7b with 19 GB GPUs: 16.2 GB usable, 15.2 GB of weights, ~16K KV tokens at
    TP 1; at TP 2 each GPU keeps 16.2 - 7.6 GB, ~150K tokens (8.6 GB / 57344 B) per GPU's share."""
    path = tmp_path / "small.yaml"
    save_profile(dataclasses.replace(load_profile("h20-qwen2.5-7b"), name="small", device_mem_gb=19.0), path)
    return path


def test_simulated_colocated_run_raises_tp_when_preemptions_jump(tmp_path, monkeypatch):
    cfg = load_config(None, [*SIM, f"sim.profile={small_memory_profile(tmp_path)}", f"trainer.output_dir={tmp_path}"])
    capacities: list[float] = []
    real_after_step = Planner.after_step

    async def recorded_after_step(self, rollout, metrics):  # the pipeline calls it between steps
        capacities.append(rollout.workers[0].engine.model.capacity)  # what this step ran with
        return await real_after_step(self, rollout, metrics)

    monkeypatch.setattr(Planner, "after_step", recorded_after_step)
    simulate(cfg, log=lambda _: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    preempted = [r["rollout/preemptions_step"] for r in steps]
    assert preempted[0] > 0  # 16K tokens per GPU cannot hold 16 responses of ~1.5K-4K tokens
    assert [r["rollout/tp_size"] for r in steps][0] == 2
    assert capacities[1] > 4 * capacities[0]  # each GPU's share of a TP-2 engine holds far more
    assert preempted[1] < preempted[0]


# ---- the real CPU engine: a tiny KV budget preempts; the planner sees it and plans ---------

@pytest.mark.slow
def test_cpu_engine_preemptions_reach_the_planner(tiny_cache, tmp_path):
    from tests.pipelines.helpers import make_context

    ctx = make_context(tmp_path, "tp_planner.enable=true", "rollout.kv_budget_tokens=96", "data.train_batch_size=8",
                       "actor.ppo_mini_batch_size=4", "rollout.n=4", "rollout.ignore_eos=true")
    logs: list[str] = []
    ctx.log = logs.append

    async def one_batch() -> dict[str, float]:
        batch = await batch_source(ctx).next(1)  # the planner plans after each batch
        return batch.metrics | await ctx.rollout.stats()

    try:
        metrics = asyncio.run(one_batch())
    finally:
        ctx.close()
    assert metrics["rollouter/preemptions"] > 0
    assert metrics["rollout/preemptions_step"] == metrics["rollouter/preemptions"]
    assert metrics["rollout/tp_size"] == 2  # planned; the torch engine keeps running with 1
    assert len(logs) == 1 and "planned size only" in logs[0]
