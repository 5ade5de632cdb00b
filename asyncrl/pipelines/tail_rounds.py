"""A round of tail batching (SPEC §4, RollPacker): the groups of one step when
`tail_batching.enable` is set, run for `asyncrl.pipelines.batch_source.BatchSource`.

    short round  ██████████▌ prompt done at its first R0 finishers (extra responses aborted)
                 ████▌
                 ███████████████▌ ✂ still running when P0 prompts are done: aborted, queued
    long round   (once P0 are queued) the queued prompts, R0 responses each, full length

The policy (which round, how big) is `asyncrl.scheduling.tail_batching`; this module runs a
round on the rollout side: launches its groups, waits for P0 done ones, aborts the rest and
queues them (with any that finished in the same engine step as the P0-th: they are the tail too),
so each short round queues exactly ceil(eta_p x P0) - P0 prompts. A prompt is never lost or
trained twice: a queued prompt stays handed out in the prompt stream (a checkpoint lists it) and
the batch source keeps the queue in its checkpoint state. Aborted partial responses are discarded
(a long round generates afresh).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from asyncrl.data import PromptIterator
from asyncrl.pipelines.common import group_uids
from asyncrl.scheduling.tail_batching import Round, TailBatcher
from asyncrl.types import Group, Mode, PromptRow, Trajectory

OnGroup = Callable[[Group], None]
"""Told of each group of a batch as soon as it is done (the stream trainer's feeder)."""


class Generating(Protocol):
    """What a round asks of the rollout side (the run's rollout router)."""

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: Mode = "train",
                              score: bool = True, partials: Sequence[Trajectory] = (),
                              keep: int = 0) -> Group: ...

    async def abort(self, request_ids: Sequence[str]) -> list[Trajectory]: ...


class TailRounds:
    """The long-prompt queue of a run (`batcher.queue`) and the rounds that fill and drain it."""

    def __init__(self, prompts: PromptIterator, rollout: Generating, batcher: TailBatcher[PromptRow]) -> None:
        self.prompts = prompts
        self.rollout = rollout
        self.batcher = batcher

    async def run(self, suffix: str, score: bool, metrics: dict[str, float],
                  on_group: OnGroup | None = None) -> list[Group]:
        """One round's P0 groups of R0 finished responses each (request ids `{uid}{suffix}/i`)."""
        rnd = self.batcher.next_round()
        rows = self.batcher.take_long() if rnd.kind == "long" else self.prompts.take(rnd.launch_prompts)
        keep = rnd.keep_responses if rnd.launch_responses > rnd.keep_responses else 0
        uids = group_uids(rows, suffix)
        tasks = [asyncio.ensure_future(self.rollout.generate_scored(
            r, rnd.launch_responses, uid, "train", score, (), keep)) for r, uid in zip(rows, uids)]
        try:
            done, late = await _first_done(tasks, rnd, on_group)
            if late:
                await self.rollout.abort([f"{uids[i]}/{k}" for i in late for k in range(rnd.launch_responses)])
            groups = list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
        first = sorted(done[: rnd.keep_prompts])
        rest = [g.row for i, g in enumerate(groups) if i not in first]
        self.batcher.enqueue(rest)
        kept = [groups[i].unaborted() for i in first]
        metrics |= round_metrics(rnd, groups, kept, len(rest), len(self.batcher.queue))
        return kept


async def _first_done(tasks: Sequence[asyncio.Future[Group]], rnd: Round,
                      on_group: OnGroup | None) -> tuple[list[int], list[int]]:
    """Indices of the groups done in finish order (P0, or more if several finished together),
    and of those still running."""
    done: list[int] = []
    pending = set(tasks)
    while pending and len(done) < rnd.keep_prompts:
        finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for i in (i for i, t in enumerate(tasks) if t in finished):
            done.append(i)
            if on_group is not None and len(done) <= rnd.keep_prompts:
                on_group(tasks[i].result().unaborted())
    return done, [i for i, t in enumerate(tasks) if t in pending]


def round_metrics(rnd: Round, launched: Sequence[Group], kept: Sequence[Group], queued: int,
                  queue_len: int) -> dict[str, float]:
    """Round type, what was aborted, the long-prompt queue, and the lengths trained."""
    aborted = [t for g in launched for t in g.trajectories if t.finish_reason == "aborted"]
    lengths = np.array([len(t.response_ids) for g in kept for t in g.trajectories], dtype=float)
    prefix = f"tail_batching/{rnd.kind}_response_length"
    out = {"tail_batching/long_round": float(rnd.kind == "long"),
           "tail_batching/launched_requests": float(rnd.launch_prompts * rnd.launch_responses),
           "tail_batching/aborted_requests": float(len(aborted)),
           "tail_batching/aborted_tokens": float(sum(len(t.response_ids) for t in aborted)),
           "tail_batching/queued_prompts": float(queued), "tail_batching/queue_length": float(queue_len)}
    if lengths.size:
        out |= {f"{prefix}/mean": float(lengths.mean()), f"{prefix}/p50": float(np.percentile(lengths, 50)),
                f"{prefix}/p90": float(np.percentile(lengths, 90)), f"{prefix}/max": float(lengths.max())}
    return out
