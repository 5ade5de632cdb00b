"""The engine's scheduler replayed without a model: what each step of a request set would do.

`replay` drives `Scheduler` the way `TorchEngine`'s loop does: every request queued before the
first step (as `run_sync` and `generate_many` queue them), then schedule -> step -> apply until
nothing runs. Each request runs to its `max_tokens`, as the benchmarks' `ignore_eos` requests do:
the stand-in sampled token is an id no vocabulary has, so no stop token ends one early. It counts
the steps by kind (with the scheduler's own `step_counts`) and the decode graphs (batch bucket,
attention length) a static engine with the padded-length decode attention would capture, which
is how issue 24 explained the GPU run's step and graph counts exactly.

A diagnostic of the benchmarks, so it lives in bench/ (issue 35): tests/rollout/test_scheduler_replay.py
asserts the admission rule's counts with it, and an engine benchmark can print the prefill steps
of its settings. It drives the package's own scheduler and graph bucketing, so a change to
either shows up in its counts.

Not here: time. A count says what a step does, not how long it takes (docs/engine.md's cost
model, the simulator in `asyncrl.sim`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

from asyncrl.rollout.graphs import attention_length, bucket_sizes
from asyncrl.rollout.scheduler import Scheduler, StepPlan, StepResult
from asyncrl.rollout.sequence import Sequence
from asyncrl.rollout.settings import EngineSettings
from asyncrl.types import GenerationRequest

_NO_TOKEN = -1
"""The stand-in sampled token: not an id of any vocabulary, so it is never a stop token."""


@dataclass(frozen=True)
class ReplayCounts:
    """Steps of one replay, by what they carry (a step can be several kinds at once)."""

    steps: int
    decode_steps: int
    """Steps with at least one decode row: decode graph replays on a static engine."""
    prefill_steps: int
    """Steps that prefill at least one admitted request (every running row waits for it)."""
    move_steps: int
    """Steps that move KV rows to keep the slots compact (after a request finishes)."""
    decode_rows: int
    """Tokens sampled by decode rows, summed over steps (the rest come from prefill rows)."""
    prefill_rows: int
    """Requests prefilled, summed over steps (re-prefills after preemption included)."""
    graphs: Counter[tuple[int, int]]
    """Decode steps per (batch bucket, attention length): one captured graph per key."""

    @property
    def mean_decode_rows(self) -> float:
        return self.decode_rows / max(self.decode_steps, 1)


def replay(requests: SequenceABC[GenerationRequest], settings: EngineSettings, *,
           one_step_late: bool = False) -> ReplayCounts:
    """Run `requests` through a `Scheduler` built as `TorchEngine` builds it from `settings`,
    with every KV slot the settings ask for (a GPU cache may hold fewer: see `KVPlan`).

    `one_step_late`: apply each step after the next one is planned, as `TorchEngine` reads its
    results (a finishing row takes one extra step); False applies each step before planning the
    next, as the engine of the GPU run that issue 24 explains did."""
    scheduler = Scheduler(settings.max_num_seqs, settings.kv_budget_tokens, settings.max_prefill_tokens,
                          admit_min_free_slots=settings.admit_min_free_slots)
    for request in requests:
        scheduler.add(Sequence.from_request(request, eos_ids=()))
    rows: Counter[str] = Counter()
    graphs: Counter[tuple[int, int]] = Counter()
    sizes = bucket_sizes(settings.max_num_seqs)
    queued: StepPlan | None = None
    while (plan := scheduler.schedule()) is not None or queued is not None:
        if plan is not None:
            _count(plan, rows, graphs, sizes, settings.max_model_len)
        for done in ((queued,) if one_step_late else (plan,)):
            if done is not None:
                scheduler.apply(done, StepResult([_NO_TOKEN] * done.num_rows, [0.0] * done.num_rows, 0))
        queued = plan if one_step_late else None
    steps = scheduler.step_counts
    return ReplayCounts(steps=steps["steps"], decode_steps=steps["decode"], prefill_steps=steps["prefill"],
                        move_steps=steps["moves"], decode_rows=rows["decode"], prefill_rows=rows["prefill"],
                        graphs=graphs)


def _count(plan: StepPlan, rows: Counter[str], graphs: Counter[tuple[int, int]], sizes: list[int],
           capacity: int) -> None:
    decode = len(plan.decode_positions)
    rows.update(decode=decode, prefill=len(plan.prefill_contexts))
    if decode:  # the key `BucketedDecode` replays (a GPU cache's capacity is max_model_len)
        bucket = next(s for s in sizes if s >= decode)
        graphs[bucket, attention_length(max(plan.decode_positions), capacity)] += 1
