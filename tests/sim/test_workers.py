"""The simulator's rollout server continues a stopped run's partial responses as the real one
does: finished ones kept, aborted ones generated for their remaining length, versions joined."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config import load_config
from asyncrl.config.schema import Config
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import load_profile
from asyncrl.sim.workers import SimRolloutServer
from asyncrl.sim.workload import Workload
from asyncrl.types import PromptRow

ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(1,) * 100)


def test_partial_responses_of_a_stopped_run_continue():
    cfg = load_config(None, ["rollout.n=4", "sim.length_median=400", "data.max_response_length=4096"])

    async def main():
        stopped = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 1, Workload(cfg, 0))
        task = asyncio.create_task(stopped.generate_scored(ROW, 4, "g"))
        await asyncio.sleep(1.0)
        await stopped.abort(["g/1", "g/3"])
        partials = (await task).trajectories
        resumed = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 1, Workload(cfg, 0))
        resumed.engine.set_version(3)  # the checkpoint's weights
        return resumed, partials, await resumed.generate_scored(ROW, 4, "g", partials=partials)

    (resumed, partials, group), _ = run_virtual(main())
    aborted = {t.request_id: t for t in partials if t.finish_reason == "aborted"}
    assert sorted(aborted) == ["g/1", "g/3"] and resumed.partial_continuations == 2
    by_id = {t.request_id: t for t in group.trajectories}
    assert sorted(by_id) == ["g/0", "g/1", "g/2", "g/3"]
    for rid, before in aborted.items():
        after = by_id[rid]
        assert after.finish_reason != "aborted" and len(after.response_ids) > len(before.response_ids) > 0
        assert after.versions[0] == 0 and after.versions[-1] == 3 and after.num_segments == 2
        assert len(after.logprobs) == len(after.versions) == len(after.response_ids)
    for t in partials:
        if t.finish_reason != "aborted":
            assert by_id[t.request_id] is t


def test_a_decoupled_trainer_does_not_pay_the_colocated_reload():
    """old_log_prob differs by exactly the profile's `logprob_pass_s` between the pipelines."""
    import dataclasses

    import numpy as np

    from asyncrl.scheduling.plan import plan_run
    from asyncrl.sim.workers import SimTrainer
    from asyncrl.types import Group

    profile = load_profile("h20-qwen2.5-7b")
    cfg = load_config(None, ["rollout.n=4", "sim.length_median=400", "data.max_response_length=4096"])
    workload = Workload(cfg, 0)

    async def both() -> tuple[dict[str, float], dict[str, float]]:
        group = await SimRolloutServer(cfg, profile, 4, workload).generate_scored(ROW, 4, "g")
        out = []
        for pipeline in ("colocated", "one_step_off"):
            c = load_config(None, [f"pipeline={pipeline}", "rollout.n=4", "data.max_response_length=4096"])
            trainer = SimTrainer(c, profile, 8, dataclasses.replace(plan_run(c), old_log_probs="recompute"))
            out.append(await trainer.train_groups([Group(group.uid, ROW, group.trajectories)]))
        return out[0], out[1]

    (colocated, decoupled), _ = run_virtual(both())
    assert colocated["timing_s/old_log_prob"] - decoupled["timing_s/old_log_prob"] == pytest.approx(
        profile.logprob_pass_s, rel=1e-9, abs=1e-9)
    assert np.isfinite(decoupled["timing_s/update_actor"])


def test_a_colocated_engine_wakes_up_after_new_weights():
    """`rollout_wake_s`: after a weight load a colocated engine decodes nothing for that long;
    a decoupled one starts at once."""
    import dataclasses

    profile = dataclasses.replace(load_profile("h20-qwen2.5-7b"), rollout_wake_s=50.0)
    ends = {}
    for pipeline in ("colocated", "one_step_off"):
        cfg = load_config(None, [f"pipeline={pipeline}", "rollout.n=4", "sim.length_median=400",
                                 "data.max_response_length=4096"])

        async def generate(cfg: Config = cfg) -> float:
            server = SimRolloutServer(cfg, profile, 4, Workload(cfg, 0))
            await server.load_weights({}, 1)
            group = await server.generate_scored(ROW, 4, "g")
            return max(t.timings["gen_end"] for t in group.trajectories)

        ends[pipeline], _ = run_virtual(generate())
    assert ends["colocated"] - ends["one_step_off"] == pytest.approx(50.0, rel=0, abs=1e-6)
