"""The batch source on the simulator's rollout side (the real router and prompt stream, modelled
engines and rewards, virtual time): plain batches, dynamic sampling's refill, tail rounds, a
batch made ahead, and its state through a checkpoint and back. Fast: no model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from asyncrl.config import load_config
from asyncrl.pipelines.batch_source import BatchSource, batch_source
from asyncrl.pipelines.checkpoint import save_checkpoint
from asyncrl.pipelines.common import finish, start, train
from asyncrl.pipelines.context import RunContext
from asyncrl.pipelines.setup import build_context
from asyncrl.sim.loop import run_virtual
from asyncrl.sim.profile import load_profile
from asyncrl.sim.substrate import SimSubstrate
from asyncrl.types import Group

P, N = 8, 2
SIM = ["sim.profile=cpu-tiny", f"data.train_batch_size={P}", f"actor.ppo_mini_batch_size={P}", f"rollout.n={N}",
       "data.max_response_length=256", "sim.length_median=64", "trainer.logger=[jsonl]", "trainer.test_freq=0",
       "trainer.val_before_train=false"]
DYNAMIC = ["pipeline=one_step_off", "algorithm.filter_groups.enable=true",
           "algorithm.filter_groups.max_num_gen_batches=0"]
TAIL = ["tail_batching.enable=true", "tail_batching.prompt_speculation=1.5"]
T = TypeVar("T")


def in_sim(out: Path, overrides: list[str], body: Callable[[RunContext, BatchSource], Awaitable[T]]) -> T:
    """`body(ctx, the run's batch source)` in a simulated run writing to `out`, after `start`
    (which resumes from the newest checkpoint there, as a pipeline does)."""
    cfg = load_config(None, [*SIM, *overrides, f"trainer.output_dir={out}"])

    async def main() -> T:
        ctx = build_context(cfg, log=lambda _: None, substrate=SimSubstrate(load_profile(cfg.sim.profile)))
        try:
            source = batch_source(ctx)
            ctx.pipeline_state = source.state
            source.restore((await start(ctx))[1])
            return await body(ctx, source)
        finally:
            finish(ctx)

    return run_virtual(main())[0]


def uids(groups: list[Group]) -> list[str]:
    return [g.uid for g in groups]


def test_a_plain_batch_is_one_group_per_prompt_of_the_stream(tmp_path):
    async def body(ctx, source):
        return await source.next(3), ctx.prompts.outstanding

    batch, outstanding = in_sim(tmp_path, [], body)
    assert [len(g.trajectories) for g in batch.groups] == [N] * P and batch.consumed == []
    assert [g.row for g in batch.groups] == outstanding  # handed out, not done until trained
    assert all(u.endswith("@3.1") for u in uids(batch.groups))  # colocated's request ids, as always
    assert batch.stages["timing_s/gen"] > 0 and batch.stages["timing_s/reward"] > 0  # a reward phase
    assert batch.metrics == {}  # no remedy on


def test_dynamic_sampling_refills_until_every_trained_group_has_a_signal(tmp_path):
    async def body(ctx, source):
        return await source.next(1), ctx.prompts.outstanding

    batch, outstanding = in_sim(tmp_path, DYNAMIC, body)
    rounds = batch.metrics["train/num_gen_batches"]
    assert rounds > 1  # half of the 2-response groups agree at sim.accuracy 0.5
    assert len(batch.groups) == P and all(len(set(g.rewards_G)) == 2 for g in batch.groups)
    assert uids(batch.groups)[0].endswith("@1.1") and uids(batch.groups)[-1].endswith(f"@1.{int(rounds)}")
    # every prompt generated is trained or consumed with the batch: P per round
    assert Counter(r.uid for r in outstanding) == Counter(
        [g.row.uid for g in batch.groups] + [r.uid for r in batch.consumed])
    assert len(batch.consumed) == rounds * P - P
    assert batch.metrics["train/filtered_groups"] <= len(batch.consumed)
    # one-step-off scores each group on the rollout side: no reward phase, the rounds are the making
    # (virtual time: the two differ only by the rounding of adding up one time per round)
    assert batch.stages["timing_s/gen"] == pytest.approx(batch.seconds, rel=1e-12)


def test_dynamic_sampling_stops_at_max_num_gen_batches(tmp_path):
    async def body(ctx, source):
        return await source.next(1)

    batch = in_sim(tmp_path, [*DYNAMIC, "algorithm.filter_groups.max_num_gen_batches=1", "sim.accuracy=0.9"], body)
    assert batch.metrics["train/num_gen_batches"] == 1 and len(batch.groups) < P
    assert len(batch.groups) + len(batch.consumed) == P


def test_tail_rounds_train_p0_groups_of_r0_and_drain_the_queue(tmp_path):
    async def body(ctx, source):
        batches = [await source.next(step) for step in range(1, 6)]
        return batches, source.state()["long_queue"], ctx.prompts.outstanding

    batches, queue, outstanding = in_sim(tmp_path, [*TAIL, "rollout.n=4", "tail_batching.response_speculation=1.5"],
                                         body)
    assert all([len(g.trajectories) for g in b.groups] == [4] * P for b in batches)
    kinds = [b.metrics["tail_batching/long_round"] for b in batches]
    assert kinds == [0.0, 0.0, 1.0, 0.0, 0.0]  # 12 launched, 8 trained, 4 queued: long once 8 are queued
    assert [b.metrics["tail_batching/queue_length"] for b in batches] == [4, 8, 0, 4, 8]
    assert {r.uid for r in queue} <= {r.uid for r in outstanding}  # queued prompts stay handed out
    assert all(u.endswith(f"@{s}") for s, b in enumerate(batches, 1) for u in uids(b.groups))


def test_a_batch_made_ahead_is_the_next_one_handed_out(tmp_path):
    async def body(ctx, source):
        source.prefetch(2)
        source.prefetch(3)  # a batch is ahead already: nothing more is made
        made = await source.next(2)
        return made, ctx.prompts.outstanding, source.ahead

    made, outstanding, ahead = in_sim(tmp_path, ["pipeline=one_step_off"], body)
    assert uids(made.groups) == [f"{g.row.uid}@2" for g in made.groups]  # one-step-off's request ids
    assert len(outstanding) == P and ahead is None
    assert made.seconds > 0


def test_the_batch_made_ahead_goes_through_a_checkpoint_with_the_prompts_it_consumed(tmp_path):
    """A checkpoint holds the finished batch ahead with the prompts dynamic sampling consumed
    for it; the resumed source hands out that batch without generating, and the prompt stream
    lists each of its prompts once."""
    async def before(ctx, source):
        first = await source.next(1)
        await train(ctx, first.groups, 1, first.consumed)
        source.prefetch(2)
        await source.settle()
        await save_checkpoint(ctx)
        return source.ahead.result(), Counter(r.uid for r in ctx.prompts.outstanding)

    async def after(ctx, source):
        drawn = ctx.prompts.state_dict()["cursor"]
        batch = await source.next(2)
        assert ctx.prompts.state_dict()["cursor"] == drawn  # nothing generated
        assert not ctx.prompts.has_replay  # its prompts claimed: none waits to be generated again
        return batch, Counter(r.uid for r in ctx.prompts.outstanding)

    held, listed = in_sim(tmp_path, DYNAMIC, before)
    resumed, relisted = in_sim(tmp_path, DYNAMIC, after)
    assert held.consumed and uids(resumed.groups) == uids(held.groups)
    assert resumed.consumed == held.consumed and resumed.metrics == held.metrics
    assert resumed.seconds == held.seconds
    assert relisted == listed == Counter([g.row.uid for g in held.groups] + [r.uid for r in held.consumed])


def test_the_long_prompt_queue_goes_through_a_checkpoint(tmp_path):
    async def before(ctx, source):
        batch = await source.next(1)
        await train(ctx, batch.groups, 1)
        await save_checkpoint(ctx)
        return [r.uid for r in source.state()["long_queue"]]

    async def after(ctx, source):
        return [r.uid for r in source.state()["long_queue"]], [r.uid for r in ctx.prompts.outstanding]

    queued = in_sim(tmp_path, [*TAIL, "tail_batching.prompt_speculation=2.0"], before)
    requeued, outstanding = in_sim(tmp_path, [*TAIL, "tail_batching.prompt_speculation=2.0"], after)
    assert len(queued) == P and requeued == queued  # 16 launched, 8 trained: the next round is long
    assert sorted(outstanding) == sorted(queued)  # claimed from the replay: not generated as new prompts


def test_a_checkpoint_from_before_the_batch_source_resumes(tmp_path):
    """One-step-off checkpoints held only `batch` (its groups): nothing consumed, no metrics."""
    async def body(ctx, source):
        made = await source.next(1)
        restored = batch_source(ctx)
        ctx.prompts.give_back(made.groups[0].row)  # as a resumed stream lists it: to hand out again
        restored.restore({"batch": made.groups[:1]})
        again = await restored.next(1)
        return made, again, ctx.prompts.has_replay

    made, again, replay = in_sim(tmp_path, ["pipeline=one_step_off"], body)
    assert uids(again.groups) == uids(made.groups[:1]) and again.consumed == [] and again.metrics == {}
    assert not replay  # claimed, not generated again


def test_one_step_off_with_dynamic_sampling_trains_full_batches_with_a_signal_one_step_stale(tmp_path):
    from asyncrl.sim.run import simulate
    from tests.pipelines.helpers import read_jsonl

    cfg = load_config(None, [*SIM, *DYNAMIC, "trainer.total_training_steps=6", f"trainer.output_dir={tmp_path}"])
    simulate(cfg, log=lambda _: None)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "timing_s/step" in r]
    assert [r["training/responses"] for r in rows] == [P * N] * 6
    assert all(r["critic/score/mean"] == 0.5 for r in rows)  # two responses, one right: every group kept has a signal
    assert max(r["train/num_gen_batches"] for r in rows) > 1
    assert [r["staleness/version_lag_max"] for r in rows] == [0] + [1] * 5  # batch k+1 made while k trains
    trained = [s["prompt"] for s in read_jsonl(tmp_path / "samples.jsonl")]
    assert len(trained) == len(set(trained)) == 6 * P
