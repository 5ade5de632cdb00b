"""Multi-turn episodes in the simulator: turns, tool latencies from the seed, a growing context
with or without the prefix cache, kept or released slots, versions and the loss mask, aborts."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config import load_config
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import load_profile
from asyncrl.sim.workers import SimRolloutServer
from asyncrl.sim.workload import Workload
from asyncrl.types import PromptRow, RunLength

ROW = PromptRow(uid="p", data_source="arithmetic", messages=(), ground_truth="1", prompt_ids=(1,) * 100)
BASE = ["rollout.n=2", "sim.length_median=400", "data.max_response_length=4096", "seed=3"]
MULTI = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_assistant_turns=4"]


def generate(overrides, n=1, during=None):
    """One group of `n` on a fresh one-GPU server: (its trajectories, the server)."""
    cfg = load_config(None, [*BASE, *overrides])
    server = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 1, Workload(cfg, cfg.seed))

    async def main():
        task = asyncio.create_task(server.generate_scored(ROW, n, "g", score=False))
        if during is not None:
            await during(server)
        return (await task).trajectories

    trajectories, _ = run_virtual(main())
    return trajectories, server


def plan(overrides, n=1):
    cfg = load_config(None, [*BASE, *MULTI, *overrides])
    return Workload(cfg, cfg.seed).episodes(ROW, 0, n)


def in_a_tool_call(server) -> bool:
    server.engine.catch_up()  # the engine model is brought to "now" only when something asks
    return bool(server.engine.model.tools)


def seconds(t):
    return t.timings["gen_end"] - t.timings["gen_start"]


def test_a_4_turn_episode_takes_longer_than_one_turn_by_its_tool_calls():
    """Same model tokens (the single-turn draw, split over 4 turns), tool results of 0 tokens:
    the episode decodes the same context, so it is longer by exactly its 3 tool calls."""
    [p] = plan(["sim.tool_output_tokens=0"])
    assert len(p.turns_T) == 4 and len(p.tool_s) == 3 and sum(p.tool_s) > 0.5
    [single], _ = generate([])
    [episode], _ = generate([*MULTI, "sim.tool_output_tokens=0"])
    assert sum(p.turns_T) == len(single.response_ids) == len(episode.response_ids)
    assert seconds(episode) - seconds(single) == pytest.approx(sum(p.tool_s), rel=1e-6, abs=1e-6)
    assert episode.episode["num_turns"] == 4 and episode.episode["tool_calls"] == 3
    assert episode.episode["tool_time_s"] == pytest.approx(sum(p.tool_s), rel=1e-12, abs=0)


def test_an_episode_is_its_turns_and_tool_results_with_the_mask_between():
    [p] = plan([])
    [episode], _ = generate(MULTI)
    t1, t2, t3, t4 = p.turns_T
    assert isinstance(episode.loss_mask, RunLength)
    assert episode.loss_mask.runs == ((1, t1), (0, 64), (1, t2), (0, 64), (1, t3), (0, 64), (1, t4))
    assert len(episode.response_ids) == len(episode.versions) == sum(p.turns_T) + 3 * 64
    assert episode.finish_reason == "stop"


def test_the_prefix_cache_prefills_only_the_tool_results():
    """With the cache: the prompt, then 64 tokens a turn. Without: turns 2-4 prefill the whole
    conversation again (prompt, earlier turns, results). Prefill time is the difference."""
    [p] = plan([])
    [cached], with_cache = generate(MULTI)
    [uncached], without = generate([*MULTI, "sim.prefix_caching=false"])
    assert with_cache.engine.model.prefilled == 100 + 3 * 64
    contexts = [100 + sum(p.turns_T[:k]) + k * 64 for k in (1, 2, 3)]
    assert without.engine.model.prefilled == 100 + sum(contexts)
    extra = (sum(contexts) - 3 * 64) * without.engine.model.prefill
    assert seconds(uncached) - seconds(cached) == pytest.approx(extra, rel=1e-6, abs=1e-9)


def test_keeping_the_slot_during_tool_calls_costs_concurrency():
    """Two slots, eight episodes: a released slot decodes another episode during a tool call;
    a kept one idles."""
    few = ["rollout.max_num_seqs=2", "sim.tool_latency_median_s=5"]
    released, _ = generate([*MULTI, *few], n=8)
    kept, server = generate([*MULTI, *few, "rollout.multi_turn.keep_slot=keep"], n=8)
    assert max(t.timings["gen_end"] for t in kept) > 1.2 * max(t.timings["gen_end"] for t in released)
    assert server.engine.model.held_seqs == 0 and server.engine.model.held_tokens == 0
    assert sorted(len(t.response_ids) for t in kept) == sorted(len(t.response_ids) for t in released)


def test_new_weights_during_a_tool_call_version_the_rest_of_the_episode():
    """The result and every later turn carry the new version; the cache is emptied, so the
    next turn prefills the whole conversation."""
    [p] = plan([])

    async def sync_in_first_call(server):
        while not in_a_tool_call(server):
            await asyncio.sleep(0.01)
        server.engine.set_version(1)

    [episode], server = generate(MULTI, during=sync_in_first_call)
    t1 = p.turns_T[0]
    assert episode.versions.runs == ((0, t1), (1, len(episode.response_ids) - t1))
    assert server.engine.model.prefilled == 100 + (100 + t1 + 64) + 2 * 64


def test_an_abort_in_a_tool_call_keeps_its_result_and_the_episode_continues():
    cfg = load_config(None, [*BASE, *MULTI, "rollout.n=2"])

    async def main():
        stopped = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 1, Workload(cfg, cfg.seed))
        task = asyncio.create_task(stopped.generate_scored(ROW, 2, "g", score=False))
        while not in_a_tool_call(stopped):
            await asyncio.sleep(0.01)
        in_call = stopped.engine.model.tools[0][6]
        await stopped.abort([f"g/{in_call}"])
        partials = (await task).trajectories
        resumed = SimRolloutServer(cfg, load_profile("h20-qwen2.5-7b"), 1, Workload(cfg, cfg.seed + 1))
        return in_call, partials, await resumed.generate_scored(ROW, 2, "g", score=False, partials=partials)

    (in_call, partials, group), _ = run_virtual(main())
    [before] = [t for t in partials if t.finish_reason == "aborted"]
    assert before.request_id == f"g/{in_call}" and before.loss_mask.runs[-1] == (0, 64)  # the result kept
    assert before.episode["tool_calls"] == 1 and before.episode["num_turns"] == 1
    [after] = [t for t in group.trajectories if t.request_id == before.request_id]
    assert after.finish_reason != "aborted"
    assert after.loss_mask.runs[:2] == before.loss_mask.runs and after.loss_mask.runs[2][0] == 1
    assert len(after.loss_mask) == len(after.response_ids) > len(before.response_ids)
    assert after.episode["num_turns"] >= 2 and after.episode["tool_calls"] >= 1


def test_single_turn_responses_are_drawn_as_before():
    """Turns and tool latencies have their own random stream: the lengths and rewards of a
    single-turn run do not move when episodes are on."""
    cfg = load_config(None, [*BASE, "rollout.n=8"])
    multi = load_config(None, [*BASE, *MULTI, "rollout.n=8"])
    one, many = Workload(cfg, 0), Workload(multi, 0)
    lengths = one.response_lengths(ROW, 0, 8)
    episodes = many.episodes(ROW, 0, 8)
    assert [sum(e.turns_T) for e in episodes] == lengths
    assert one.rewards(8) == many.rewards(8)
