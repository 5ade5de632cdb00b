"""Where a synchronous step's batch comes from: one `BatchSource` per run, which the colocated
pipeline awaits inline and the one-step-off pipeline one step ahead (SPEC §1, §2, §4).

    plain          [gen P prompts x n ██████████▌][reward]                     P groups
    dynamic        [gen P ████████▌][reward] drop groups whose rewards all agree,
    sampling       [gen P ██████▌][reward]   again until P are kept (or
                                             algorithm.filter_groups.max_num_gen_batches rounds)
    tail rounds    [short round ███▌✂] or [long round █████████] (`tail_rounds`)
    then           the TP planner: this batch's preemptions -> the rollout TP for the next one

`next(step)` hands out batch `step`: the one made ahead (`prefetch`) or restored from a
checkpoint if there is one, else it makes it now. Each group is handed to `on_group` (the stream
trainer's feeder) as soon as it is done. The state a checkpoint keeps (`state`, `restore`): the
long-prompt queue and a batch made ahead and finished, with the prompts its making consumed, so
that a resumed run trains exactly what the uninterrupted one would. Group uids are those the
pipelines always used, because each response's sampling seed derives from its request id
(`asyncrl.workers.rollout`): a run's samples stay those of earlier runs of the same config.

Not here: training, weight sync, stop signals (the pipelines race their waits), which remedies
combine (config validation), the round policy (`asyncrl.scheduling.tail_batching`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from asyncrl.config.schema import FilterGroupsConfig
from asyncrl.data import PromptIterator
from asyncrl.pipelines.common import group_uids
from asyncrl.pipelines.planning import Planner
from asyncrl.pipelines.tail_rounds import Generating, OnGroup, TailRounds
from asyncrl.scheduling.tail_batching import TailBatcher
from asyncrl.telemetry import clock
from asyncrl.telemetry.metrics import reward_overlap_metrics, timer
from asyncrl.types import Group, PromptRow

if TYPE_CHECKING:
    from asyncrl.pipelines.context import RunContext


class Rollout(Generating, Protocol):
    """What the batch source asks of the rollout side (the run's rollout router)."""

    async def score(self, groups: list[Group]) -> list[Group]: ...

    async def stats(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class Making:
    """How a run's batches are made (read from the config once, by `batch_source`)."""

    n: int
    """Responses per prompt (rollout.n)."""
    batch_size: int
    """Groups a batch trains (data.train_batch_size)."""
    filter_groups: FilterGroupsConfig
    """DAPO dynamic sampling: drop groups whose rewards all agree, generate more prompts."""
    reward_phase: bool
    """Score after generation in a timed reward phase, rather than on the rollout side as each
    group (or, with the reward scheduler, each response) finishes."""
    greedy_baselines: bool = False
    """ReMax: one greedy response per prompt, whose reward is the group's baseline."""
    numbered_rounds: bool = True
    """Group uids `{prompt}@{step}.{round}` (else `{prompt}@{step}`, one-step-off's plain batches)."""


@dataclass(frozen=True)
class Batch:
    """One step's groups to train and what their making did."""

    groups: list[Group]
    """data.train_batch_size groups (fewer when dynamic sampling ran out of rounds)."""
    consumed: list[PromptRow]
    """Prompts generated for this batch and not trained (dropped by dynamic sampling, or beyond
    the batch): recorded as done with it."""
    metrics: dict[str, float]
    """What the remedies did: dynamic sampling's rounds and drops, the tail round, the TP plan."""
    stages: dict[str, float]
    """The making's stage times (`timing_s/gen`, `reward`, `gen_max`) and the share of rewards
    hidden behind generation: the step's own when the batch is made inline."""
    seconds: float
    """Wall time of the whole making (one-step-off logs it as `timing_s/generate_sequences`)."""


class BatchSource:
    """The batches of a run, one per step, made by plain generation, dynamic sampling or tail
    rounds; `prefetch` makes the next one in the background."""

    def __init__(self, prompts: PromptIterator, rollout: Rollout, making: Making,
                 rounds: TailBatcher[PromptRow] | None = None, planner: Planner | None = None) -> None:
        self.prompts = prompts
        self.rollout = rollout
        self.making = making
        self.rounds = TailRounds(prompts, rollout, rounds) if rounds is not None else None
        self.planner = planner
        self.ahead: asyncio.Future[Batch] | None = None
        """Batch `step + 1`, being made or made, while step `step` trains (one-step-off)."""

    async def next(self, step: int, on_group: OnGroup | None = None) -> Batch:
        """Batch `step`: the one made ahead if any (it is then the caller's), else made now;
        then the TP planner plans from its preemptions (nothing is in flight)."""
        ahead, self.ahead = self.ahead, None
        batch = await ahead if ahead is not None else await self._make(step, on_group)
        if self.planner is None:
            return batch
        metrics = dict(batch.metrics)
        await self.planner.after_step(self.rollout, metrics)
        return dataclasses.replace(batch, metrics=metrics)

    def prefetch(self, step: int) -> None:
        """Start making batch `step` in the background, unless a batch is ahead already (a
        checkpoint held it)."""
        if self.ahead is None:
            self.ahead = asyncio.ensure_future(self._make(step, None))

    async def settle(self) -> None:
        """Wait until the batch made ahead is finished, so that a checkpoint holds it."""
        if self.ahead is not None:
            await asyncio.shield(self.ahead)

    def cancel(self) -> None:
        """Stop making the batch ahead (its prompts stay handed out: a checkpoint lists them)."""
        if self.ahead is not None:
            self.ahead.cancel()

    async def _make(self, step: int, on_group: OnGroup | None) -> Batch:
        start, metrics, stages = clock.now(), dict[str, float](), dict[str, float]()
        if self.rounds is not None:
            with timer("gen", stages):
                groups = await self.rounds.run(f"@{step}", not self.making.reward_phase, metrics, on_group)
            groups, consumed = await self._score(groups, stages), list[PromptRow]()
        else:
            groups, consumed = await self._sampled(step, metrics, stages, on_group)
        return Batch(groups, consumed, metrics, stages, clock.now() - start)

    async def _sampled(self, step: int, metrics: dict[str, float], stages: dict[str, float],
                       on_group: OnGroup | None) -> tuple[list[Group], list[PromptRow]]:
        """batch_size scored groups and the prompts consumed; with dynamic sampling, groups whose
        rewards all agree are dropped and more prompts generated (up to max_num_gen_batches rounds)."""
        want, fg = self.making.batch_size, self.making.filter_groups
        kept: list[Group] = []
        dropped: list[Group] = []
        rounds = 0
        while len(kept) < want and (rounds == 0 or not fg.max_num_gen_batches or rounds < fg.max_num_gen_batches):
            rounds += 1
            suffix = f"@{step}.{rounds}" if self.making.numbered_rounds else f"@{step}"
            for g in await self._generate(self.prompts.next_batch(), suffix, stages, on_group):
                (kept if not fg.enable or len(set(g.rewards_G)) > 1 else dropped).append(g)
        if fg.enable:
            metrics["train/num_gen_batches"] = rounds
            metrics["train/filtered_groups"] = rounds * want - len(kept)
        return kept[:want], [g.row for g in dropped + kept[want:]]

    async def _generate(self, rows: list[PromptRow], suffix: str, stages: dict[str, float],
                        on_group: OnGroup | None) -> list[Group]:
        """One group per row, scored (and with ReMax its greedy baseline)."""
        n, score_now = self.making.n, not self.making.reward_phase
        with timer("gen", stages):
            tasks = [asyncio.ensure_future(self.rollout.generate_scored(r, n, uid, "train", score_now))
                     for r, uid in zip(rows, group_uids(rows, suffix))]
            if on_group is not None:
                for task in tasks:
                    task.add_done_callback(lambda t: on_group(t.result()) if not t.cancelled() and not t.exception()
                                           else None)
            groups = list(await asyncio.gather(*tasks))
        groups = await self._score(groups, stages)
        if self.making.greedy_baselines:
            await self._greedy_baselines(groups, stages)
        return groups

    async def _score(self, groups: list[Group], stages: dict[str, float]) -> list[Group]:
        """The reward phase after generation, or (scored as they finished) how much of it was hidden."""
        if not self.making.reward_phase:
            stages |= reward_overlap_metrics(groups)
            return groups
        with timer("reward", stages):
            return await self.rollout.score(groups)

    async def _greedy_baselines(self, groups: Sequence[Group], stages: dict[str, float]) -> None:
        """ReMax's baseline: the reward of one greedy response per prompt."""
        with timer("gen_max", stages):
            greedy = await asyncio.gather(*(
                self.rollout.generate_scored(g.row, 1, g.uid + "/greedy", "greedy") for g in groups))
        for g, b in zip(groups, greedy):
            g.baseline_reward = b.trajectories[0].reward

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the long-prompt queue, and the batch made ahead if it is
        finished (one being made is not: its prompts are listed as handed out, and made again)."""
        out: dict[str, Any] = {"long_queue": list(self.rounds.batcher.queue)} if self.rounds is not None else {}
        t = self.ahead
        if t is not None and t.done() and not t.cancelled() and t.exception() is None:
            b = t.result()
            out |= {"batch": b.groups, "batch_consumed": b.consumed, "batch_metrics": b.metrics,
                    "batch_seconds": b.seconds}
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from `state()`. The queue's and the held batch's prompts are outstanding in the
        checkpoint's prompt stream: claimed, not generated again. (A checkpoint written before
        the batch source held only `long_queue` and `batch`: the rest default to nothing.)"""
        if self.rounds is not None:
            for row in state.get("long_queue", []):
                self.prompts.claim(row)
                self.rounds.batcher.enqueue([row])
        if state.get("batch"):
            batch = Batch(state["batch"], state.get("batch_consumed", []), state.get("batch_metrics", {}), {},
                          state.get("batch_seconds", 0.0))
            for row in [*(g.row for g in batch.groups), *batch.consumed]:
                self.prompts.claim(row)
            self.ahead = asyncio.get_running_loop().create_future()
            self.ahead.set_result(batch)


def batch_source(ctx: RunContext) -> BatchSource:
    """The run's batch source. The colocated pipeline scores in a reward phase after generation
    unless the reward scheduler or the stream trainer scores on the rollout side; one-step-off
    always scores on the rollout side, as each group finishes, while its trainer trains."""
    cfg, prompts = ctx.cfg, ctx.plan.prompts_per_update
    colocated = cfg.pipeline == "colocated"
    making = Making(n=cfg.rollout.n, batch_size=prompts, filter_groups=cfg.algorithm.filter_groups,
                    reward_phase=colocated and not (cfg.reward_scheduler.enable or cfg.stream_trainer.enable),
                    greedy_baselines=cfg.algorithm.adv_estimator == "remax",
                    numbered_rounds=colocated or cfg.algorithm.filter_groups.enable)
    t = cfg.tail_batching
    rounds = TailBatcher[PromptRow](prompts, cfg.rollout.n, t.prompt_speculation, t.response_speculation) \
        if t.enable else None
    return BatchSource(ctx.prompts, ctx.rollout, making, rounds, Planner.from_config(cfg, ctx.log))
