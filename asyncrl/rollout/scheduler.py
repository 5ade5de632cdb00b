"""Continuous-batching scheduler: admission, KV-budget preemption, slot compaction, step plans.

Runs in the event-loop thread between steps and does no I/O and no tensor work: it turns the
waiting queue and the running set into a `StepPlan` (plain lists for the step thread) and applies
a `StepResult` back onto the sequences.

Policy, per step:
1. sweep out finished/aborted running sequences; the last slot moves into each hole so running
   sequences always occupy slots 0..B-1;
2. preempt (recompute mode) while the decode of every running sequence would push the cached
   tokens past `kv_budget_tokens`: the youngest admitted sequence drops its cache and goes back
   to the front of the waiting queue with its tokens and log-probs; re-admission re-prefills
   prompt + generated tokens;
3. admit, when at least min(`min_free_slots`, waiting requests) slots are free or nothing runs,
   FCFS from the waiting queue while slots, the token budget and the per-step prefill budget
   (rows × longest context, i.e. padded tokens) allow; one admission per step is always allowed
   when it fits the token budget, however long its context.

Why admission waits for free slots: a step that prefills makes every running row wait for the
prefill, and a prefill step costs about the same for one prompt as for eight (on a GPU it is
bound by kernel launches: ~55 ms eager against ~4 ms for a decode step of 64 rows, issue 24).
Admitting as soon as one slot frees prefilled in 183 steps of the GPU benchmark at batch 64;
waiting for 8 free slots, 28 (`asyncrl.rollout.replay`). A short queue never waits: with fewer
requests waiting than `min_free_slots`, as many free slots as there are requests suffice.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass

from asyncrl.rollout.sequence import Sequence
from asyncrl.types import SamplingParams


@dataclass(frozen=True)
class StepPlan:
    """What one model step computes. Rows: decode rows (slot i = row i), then prefill rows."""

    moves: tuple[tuple[int, int, int], ...]  # (src_slot, dst_slot, length), applied in order
    decode_positions: tuple[int, ...]  # where each decode row's last sampled token goes in its cache slot
    prefill_contexts: tuple[tuple[int, ...], ...]  # prompt + generated, from position 0
    params: tuple[SamplingParams, ...]
    keys: tuple[int, ...]  # per-row sampling key (`Sequence.sample_key`)
    seqs: tuple[Sequence, ...]  # for apply(); the step thread must not read these

    @property
    def num_rows(self) -> int:
        return len(self.seqs)


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]
    logprobs: list[float]
    version: int  # weights version the step ran under


class Scheduler:
    """Waiting queue + compact running set under a slot limit and a KV token budget."""

    def __init__(self, max_num_seqs: int, kv_budget_tokens: int, max_prefill_tokens: int,
                 min_free_slots: int = 1) -> None:
        """`min_free_slots`: admit only when this many slots are free (fewer when fewer requests
        wait, any number when nothing runs); capped at `max_num_seqs`. 1 admits whenever a slot frees."""
        assert min_free_slots >= 1, min_free_slots
        self.max_num_seqs = max_num_seqs
        self.min_free_slots = min(min_free_slots, max_num_seqs)
        self.kv_budget_tokens = kv_budget_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self._moves: list[tuple[int, int, int]] = []
        self._admitted = 0
        self.step_counts: Counter[str] = Counter()
        """Steps planned, by what they carry: "steps", "decode" (any decode row), "prefill" (any
        admitted row), "moves" (KV rows moved); a step can count under several."""

    # ---- queue edits (event-loop thread, any time) ----

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def drop_waiting(self, seq: Sequence) -> bool:
        """Remove a waiting sequence now; running ones are swept at the next step boundary."""
        try:
            self.waiting.remove(seq)
        except ValueError:
            return False
        return True

    def clear(self) -> list[Sequence]:
        """Forget everything (engine shutdown); returns what was in flight."""
        seqs = list(self.running) + list(self.waiting)
        self.running, self.waiting, self._moves = [], deque(), []
        return seqs

    @property
    def kv_used_tokens(self) -> int:
        return sum(s.cached_len for s in self.running)

    # ---- step boundary (no step in flight) ----

    def sweep(self) -> None:
        """Remove running sequences that finished or were aborted, keeping slots compact."""
        for seq in [s for s in self.running if s.finish_reason is not None]:
            self._remove_running(seq)

    def schedule(self) -> StepPlan | None:
        """Plan the next step, or None when there is nothing to run."""
        self.sweep()
        self._preempt_to_fit()
        num_decode = len(self.running)
        admitted = self._admit()
        if not self.running:
            return None
        decode = self.running[:num_decode]
        rows = decode + admitted
        plan = StepPlan(
            moves=tuple(self._moves),
            decode_positions=tuple(s.cached_len for s in decode),
            prefill_contexts=tuple(tuple(s.context_ids) for s in admitted),
            params=tuple(s.request.params for s in rows),
            keys=tuple(s.sample_key for s in rows),
            seqs=tuple(rows),
        )
        self._moves = []
        # What the step caches is known now, before its token is: the engine plans the next
        # step while this one runs (its decode rows read the sampled tokens on the device).
        for seq in decode:
            seq.cached_len += 1
            seq.in_flight += 1
        for seq in admitted:
            seq.cached_len = seq.context_len
            seq.in_flight += 1
        self.step_counts.update(steps=1, decode=num_decode > 0, prefill=bool(admitted), moves=bool(plan.moves))
        return plan

    def apply(self, plan: StepPlan, result: StepResult) -> list[Sequence]:
        """Append each row's new token; returns sequences that just finished (not aborted ones).
        A row that finished at an earlier step (its extra step, when the engine planned this one
        before reading that) or was aborted meanwhile drops its token."""
        finished: list[Sequence] = []
        for row, seq in enumerate(plan.seqs):
            seq.in_flight -= 1
            if seq.finish_reason is not None:
                continue
            seq.append(result.tokens[row], result.logprobs[row], result.version)
            if seq.first_token_at is None:
                seq.first_token_at = time.perf_counter()
            reason = seq.finished_by()
            if reason is not None:
                seq.finish_reason = reason
                finished.append(seq)
        return finished

    # ---- internals ----

    def _remove_running(self, seq: Sequence) -> None:
        hole, last = seq.slot, len(self.running) - 1
        if hole != last:
            mover = self.running[last]
            self._moves.append((last, hole, mover.cached_len))
            mover.slot = hole
            self.running[hole] = mover
        self.running.pop()
        seq.slot, seq.cached_len = -1, 0

    def _preempt_to_fit(self) -> None:
        # Each decode row adds one cached token this step.
        need = sum(s.cached_len + 1 for s in self.running)
        while need > self.kv_budget_tokens and len(self.running) > 1:
            victim = max(self.running, key=lambda s: s.admit_order)
            need -= victim.cached_len + 1
            self._remove_running(victim)
            self.waiting.appendleft(victim)
            self.preemptions += 1

    def _admit(self) -> list[Sequence]:
        free = self.max_num_seqs - len(self.running)
        if self.running and free < min(self.min_free_slots, len(self.waiting)):
            return []  # decode on; admit once enough slots are free to share one prefill step
        used = sum(s.cached_len + 1 for s in self.running)
        longest = 0
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            if self.waiting[0].in_flight:  # preempted while its last token was sampled: prefill it once known
                break
            n = self.waiting[0].context_len
            if used + n > self.kv_budget_tokens:
                break
            # The prefill is right-padded to its longest context: bound the padded size, which
            # is what the forward and its (rows, T, T) mask cost.
            if admitted and (len(admitted) + 1) * max(longest, n) > self.max_prefill_tokens:
                break
            seq = self.waiting.popleft()
            seq.slot = len(self.running)
            seq.admit_order = self._admitted
            if seq.first_admitted_at is None:
                seq.first_admitted_at = time.perf_counter()
            self._admitted += 1
            self.running.append(seq)
            admitted.append(seq)
            used += n
            longest = max(longest, n)
        return admitted
