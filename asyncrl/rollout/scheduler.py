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
3. admit, when at least min(`admit_min_free_slots`, waiting requests) slots are free or nothing runs,
   FCFS from the waiting queue while slots, the token budget and the per-step prefill budget
   (rows × longest context, i.e. padded tokens) allow; one admission per step is always allowed
   when it fits the token budget, however long its context.

With a prefix cache (`asyncrl.rollout.prefix_cache`, `EngineSettings.prefix_cache`), a sequence
that leaves keeps its K/V in a free slot past the running ones, and an admitted sequence whose
context starts with a cached prefix takes that slot's K/V and prefills only the rest
(`StepPlan.prefill_starts`); cached entries count against the token budget and are evicted before
any running sequence is preempted.

Why admission waits for free slots: a step that prefills makes every running row wait for the
prefill, and a prefill step costs about the same for one prompt as for eight (on a GPU it is
bound by kernel launches: ~55 ms eager against ~4 ms for a decode step of 64 rows, issue 24).
Admitting as soon as one slot frees prefilled in 183 steps of the GPU benchmark at batch 64;
waiting for 8 free slots, 28 (`bench/scheduler_replay.py`). A short queue never waits: with fewer
requests waiting than `admit_min_free_slots`, as many free slots as there are requests suffice.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass

from asyncrl.rollout.kv_cache import Move
from asyncrl.rollout.prefix_cache import CachedPrefix, PrefixCache
from asyncrl.rollout.sequence import Sequence
from asyncrl.types import SamplingParams


@dataclass(frozen=True)
class StepPlan:
    """What one model step computes. Rows: decode rows (slot i = row i), then prefill rows."""

    moves: tuple[Move, ...]  # (src_slot, dst_slot, length), applied in order; a negative length swaps
    decode_positions: tuple[int, ...]  # where each decode row's last sampled token goes in its cache slot
    prefill_contexts: tuple[tuple[int, ...], ...]  # prompt + generated, from position 0
    params: tuple[SamplingParams, ...]
    keys: tuple[int, ...]  # per-row sampling key (`Sequence.sample_key`)
    seqs: tuple[Sequence, ...]  # for apply(); the step thread must not read these
    prefill_starts: tuple[int, ...] = ()  # per prefill row, positions its slot holds already (empty: none)
    cache_slots: int = 0  # with a prefix cache: slots the KV cache keeps (entries past the rows), else 0
    cache_len: int = 0  # with a prefix cache: its longest entry (the KV cache keeps one position more)

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
                 admit_min_free_slots: int = 1, prefix: PrefixCache | None = None) -> None:
        """`admit_min_free_slots`: admit only when this many slots are free (fewer when fewer
        requests wait, any number when nothing runs); capped at `max_num_seqs`. 1 admits whenever a
        slot frees.
        `prefix`: keep leaving sequences' K/V and reuse it (None: every prefill from position 0)."""
        assert admit_min_free_slots >= 1, admit_min_free_slots
        self.max_num_seqs = max_num_seqs
        self.admit_min_free_slots = min(admit_min_free_slots, max_num_seqs)
        self.kv_budget_tokens = kv_budget_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.prefix = prefix
        self.prefix_queries = 0
        """Admissions that looked up the prefix cache."""
        self.prefix_hit_tokens = 0
        """Context positions admissions took from the prefix cache instead of prefilling."""
        self.prefill_tokens = 0
        """Context positions admissions prefilled (a GRPO group's shared prompt counted per row)."""
        self._moves: list[Move] = []
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
        if self.prefix is not None:  # whether the last moves ran is unknown: trust no slot
            self.prefix.clear()
        return seqs

    @property
    def kv_used_tokens(self) -> int:
        return sum(s.cached_len for s in self.running)

    # ---- step boundary (no step in flight) ----

    def sweep(self) -> None:
        """Remove running sequences that finished or were aborted, keeping slots compact."""
        for seq in [s for s in self.running if s.finish_reason is not None]:
            self._remove_running(seq, keep=True)

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
        starts, cache_slots, cache_len = self._cache_fields(admitted)
        plan = StepPlan(
            moves=tuple(self._moves),
            decode_positions=tuple(s.cached_len for s in decode),
            prefill_contexts=tuple(tuple(s.context_ids) for s in admitted),
            params=tuple(s.request.params for s in rows),
            keys=tuple(s.sample_key for s in rows),
            seqs=tuple(rows),
            prefill_starts=starts, cache_slots=cache_slots, cache_len=cache_len,
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

    def _cache_fields(self, admitted: list[Sequence]) -> tuple[tuple[int, ...], int, int]:
        """The plan's prefill starts, and the slots and positions the KV cache must keep (the
        prefix cache's entries live past the rows); (), 0, 0 without a prefix cache."""
        if self.prefix is None:
            return (), 0, 0
        # what moves carry is a running row's (within its next position) or an entry's
        moved = [max(src, dst) + 1 for src, dst, _ in self._moves]
        return (tuple(s.reused for s in admitted), max([self.prefix.top_slot, len(self.running), *moved]),
                self.prefix.longest)

    def _remove_running(self, seq: Sequence, keep: bool = False) -> None:
        """Take `seq` out of its slot, the last running one moving in; `keep`: its K/V become a
        prefix-cache entry (when there is a cache)."""
        hole, last = seq.slot, len(self.running) - 1
        kept = self.prefix.retire(seq.cached_ids, last) if keep and self.prefix is not None else 0
        if hole != last:
            mover = self.running[last]  # a kept entry swaps with it (a negative length), into the last slot
            self._moves.append((hole, last, -max(kept, mover.cached_len)) if kept else (last, hole, mover.cached_len))
            mover.slot = hole
            self.running[hole] = mover
        self.running.pop()
        seq.slot, seq.cached_len = -1, 0

    def _preempt_to_fit(self) -> None:
        # Each decode row adds one cached token this step.
        need = sum(s.cached_len + 1 for s in self.running)
        if self.prefix is not None:  # cached entries go before any running sequence
            need += self.prefix.tokens - self.prefix.evict(need + self.prefix.tokens - self.kv_budget_tokens)
        while need > self.kv_budget_tokens and len(self.running) > 1:
            victim = max(self.running, key=lambda s: s.admit_order)
            need -= victim.cached_len + 1
            self._remove_running(victim)
            self.waiting.appendleft(victim)
            self.preemptions += 1

    def _admit(self) -> list[Sequence]:
        free = self.max_num_seqs - len(self.running)
        if self.running and free < min(self.admit_min_free_slots, len(self.waiting)):
            return []  # decode on; admit once enough slots are free to share one prefill step
        used = sum(s.cached_len + 1 for s in self.running)
        longest = 0
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            if self.waiting[0].in_flight:  # preempted while its last token was sampled: prefill it once known
                break
            n = self.waiting[0].context_len
            hit, reuse = self.prefix.lookup(self.waiting[0].context_ids) if self.prefix is not None else (None, 0)
            # The prefill is right-padded to its longest context: bound the padded size, which
            # is what the forward and its (rows, T, T) mask cost.
            if admitted and (len(admitted) + 1) * max(longest, n - reuse) > self.max_prefill_tokens:
                break
            taken = len(hit.tokens) if hit is not None and PrefixCache.consumes(hit, reuse) else 0
            if not self._fits(used + n - taken, hit):  # (may evict entries: checked last)
                break
            if self.prefix is not None:
                moves = self.prefix.place(len(self.running), hit, reuse)
                if moves is None:  # its slot holds a pinned entry and no other slot is free
                    break
                self._moves += moves
                self.prefix_queries += 1
                self.prefix_hit_tokens += reuse
            seq = self.waiting.popleft()
            seq.reused = reuse
            self.prefill_tokens += n - reuse
            seq.slot = len(self.running)
            seq.admit_order = self._admitted
            if seq.first_admitted_at is None:
                seq.first_admitted_at = time.perf_counter()
            self._admitted += 1
            self.running.append(seq)
            admitted.append(seq)
            used += n
            longest = max(longest, n - reuse)
        return admitted

    def _fits(self, running_tokens: int, hit: CachedPrefix | None) -> bool:
        """Whether running sequences of `running_tokens` fit the budget beside the cached
        entries, evicting unpinned ones (never `hit`, which the admission consumes) to make room."""
        if self.prefix is None:
            return running_tokens <= self.kv_budget_tokens
        over = running_tokens + self.prefix.tokens - self.kv_budget_tokens
        if over > 0:
            self.prefix.evict(over, spare=hit)
        return running_tokens + self.prefix.tokens <= self.kv_budget_tokens
