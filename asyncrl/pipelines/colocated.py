"""The colocated synchronous pipeline: the same resources do every phase, one after another.

    time ─────────────────────────────────────────────────────────────────────────▶
    engines  [gen k ████████▌      ]                               [gen k+1 ███████
    trainer                         [rew][old_lp][ref][adv][update]
    sync                                                            ▌param_sync
             └──────────── step k: the update waits for the longest response ──┘

This is the baseline the decoupled pipelines are measured against (SPEC §1): on-policy,
old log-probs recomputed by the actor, DAPO dynamic sampling optional
(`algorithm.filter_groups`). It overlaps nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from asyncrl.pipelines.common import after_step, group_uids, guarded, start, train, validate_before_training
from asyncrl.pipelines.planning import Planner
from asyncrl.pipelines.setup import RunContext
from asyncrl.pipelines.streaming import StreamFeeder
from asyncrl.pipelines.tail_rounds import OnGroup, TailRounds
from asyncrl.scheduling.stream_trigger import StreamTrigger
from asyncrl.telemetry.metrics import reward_overlap_metrics, timer
from asyncrl.types import Group, PromptRow


async def run(ctx: RunContext) -> int:
    """Train until trainer.total_training_steps; returns the last finished step."""
    return await guarded(ctx, _loop(ctx))


@dataclass
class Remedies:
    """The long-tail remedies this run has on (SPEC §4); each is None when off."""

    rounds: TailRounds | None = None
    trigger: StreamTrigger | None = None
    planner: Planner | None = None

    @classmethod
    def of(cls, ctx: RunContext) -> Remedies:
        s = ctx.cfg.stream_trainer
        return cls(TailRounds(ctx) if ctx.cfg.tail_batching.enable else None,
                   StreamTrigger(s.min_done, s.max_done, s.check_every) if s.enable else None,
                   Planner.from_config(ctx.cfg, ctx.log))


async def _loop(ctx: RunContext) -> int:
    remedies = Remedies.of(ctx)
    if remedies.rounds is not None:
        ctx.pipeline_state = remedies.rounds.state
    step, state = await start(ctx)
    if remedies.rounds is not None:
        remedies.rounds.restore(ctx, state)
    await validate_before_training(ctx, step)
    while step < ctx.cfg.trainer.total_training_steps:
        step += 1
        await train_one_step(ctx, step, remedies)
    return step


async def train_one_step(ctx: RunContext, step: int, remedies: Remedies | None = None) -> None:
    metrics: dict[str, float] = {}
    r = remedies or Remedies()
    feeder = StreamFeeder(ctx, r.trigger) if r.trigger is not None else None
    on_group = feeder.on_group if feeder is not None else None
    with timer("step", metrics):
        filtered: list[Group] = []
        try:
            if r.rounds is not None:
                groups = await ctx.stop.race(generate_tail_batch(ctx, r.rounds, step, metrics, on_group))
            else:
                groups, filtered = await ctx.stop.race(generate_batch(ctx, step, metrics, on_group))
        except BaseException:
            if feeder is not None:
                feeder.cancel()
            raise
        metrics |= await train(ctx, groups, step, consumed=[g.row for g in filtered],
                               update=feeder.finish if feeder is not None else None)
        if groups:
            with ctx.trace.span("sync", "sync", step=step):
                metrics |= await ctx.synchronizer.sync()
    if r.planner is not None:  # between steps: nothing in flight
        await r.planner.after_step(ctx.rollout, metrics)
    await after_step(ctx, step, metrics, groups)


def scored_on_rollout(ctx: RunContext) -> bool:
    """Whether groups are scored on the rollout side as they finish (the reward scheduler, or the
    stream trainer, which trains a group as soon as it is in) rather than in a reward phase."""
    return ctx.cfg.reward_scheduler.enable or ctx.cfg.stream_trainer.enable


async def generate_tail_batch(ctx: RunContext, rounds: TailRounds, step: int, metrics: dict[str, float],
                              on_group: OnGroup | None = None) -> list[Group]:
    """Tail batching: this step's groups from a short or a long round."""
    streamed = scored_on_rollout(ctx)
    with timer("gen", metrics):
        groups = await rounds.run(ctx, f"@{step}", streamed, metrics, on_group)
    return await _rewards(ctx, groups, streamed, metrics)


async def generate_batch(ctx: RunContext, step: int, metrics: dict[str, float],
                         on_group: OnGroup | None = None) -> tuple[list[Group], list[Group]]:
    """train_batch_size scored groups, and those generated but not trained; with dynamic
    sampling, groups whose rewards all agree are dropped and more prompts are generated (up to
    max_num_gen_batches rounds)."""
    want, fg = ctx.cfg.data.train_batch_size, ctx.cfg.algorithm.filter_groups
    kept: list[Group] = []
    filtered: list[Group] = []
    rounds = 0
    while len(kept) < want and (rounds == 0 or not fg.max_num_gen_batches or rounds < fg.max_num_gen_batches):
        rounds += 1
        groups = await generate_scored(ctx, ctx.prompts.next_batch(), f"@{step}.{rounds}", metrics, on_group)
        for g in groups:
            (kept if not fg.enable or len(set(g.rewards_G)) > 1 else filtered).append(g)
    if fg.enable:
        metrics["train/num_gen_batches"] = rounds
        metrics["train/filtered_groups"] = rounds * want - len(kept)
    return kept[:want], filtered + kept[want:]


async def generate_scored(ctx: RunContext, rows: list[PromptRow], suffix: str, metrics: dict[str, float],
                          on_group: OnGroup | None = None) -> list[Group]:
    n, streamed = ctx.cfg.rollout.n, scored_on_rollout(ctx)
    with timer("gen", metrics):
        tasks = [asyncio.ensure_future(ctx.rollout.generate_scored(r, n, uid, "train", streamed))
                 for r, uid in zip(rows, group_uids(rows, suffix))]
        if on_group is not None:
            for task in tasks:
                task.add_done_callback(lambda t: on_group(t.result()) if not t.cancelled() and not t.exception()
                                       else None)
        groups = await asyncio.gather(*tasks)
    groups = await _rewards(ctx, list(groups), streamed, metrics)
    if ctx.cfg.algorithm.adv_estimator == "remax":
        await _remax_baselines(ctx, groups, suffix, metrics)
    return groups


async def _rewards(ctx: RunContext, groups: list[Group], streamed: bool, metrics: dict[str, float]) -> list[Group]:
    """The reward phase after generation, or (scored as they finished) how much of it was hidden."""
    if streamed:
        metrics |= reward_overlap_metrics(groups)
        return groups
    with timer("reward", metrics):
        return await ctx.rollout.score(groups)


async def _remax_baselines(ctx: RunContext, groups: list[Group], suffix: str, metrics: dict[str, float]) -> None:
    """ReMax's baseline: the reward of one greedy response per prompt."""
    with timer("gen_max", metrics):
        greedy = await asyncio.gather(*(
            ctx.rollout.generate_scored(g.row, 1, g.uid + "/greedy", "greedy") for g in groups))
    for g, b in zip(groups, greedy):
        g.baseline_reward = b.trajectories[0].reward
