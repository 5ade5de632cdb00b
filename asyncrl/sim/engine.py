"""A modelled rollout engine: continuous batching, KV capacity, preemption, in virtual time.

`EngineModel` is the arithmetic (no asyncio): between two events the running batch is fixed,
so each decode step costs `a + b*B + c*context` with context growing by B tokens a step, and
the time to go from decode position S0 to S1 has a closed form. Events are a request
finishing, the KV cache filling up (the newest request is preempted and later recomputed, as
vLLM's recompute preemption does), an arrival, a pause/interrupt, an abort of selected
responses (they leave with the tokens they have), or a version change.
Millions of responses therefore cost a few heap operations each, not one Python step per token.

`SimEngine` puts the model on the event loop: it looks ahead on a copy to the next moment a
whole group finishes, sets one timer there, and resolves that group's future when it fires.
Anything that arrives before then (a new group, a pause) first brings the model to "now".

Admission follows `TorchEngine`'s rule (`asyncrl.rollout.scheduler`): waiting requests join
when at least min(`min_free_slots`, waiting) slots are free or nothing runs; 1 admits whenever
a request finishes. Prefill is charged per token, with no fixed cost per prefill step, so a
larger `min_free_slots` shows what the rule costs (slots idle while they wait) and not what it
saves on a GPU (fewer launch-bound prefill steps stalling the batch).

Multi-turn episodes (`asyncrl.sim.episodes`): a request with `Turns` is a whole episode. When a
turn ends it leaves the batch for its tool call (an event at the call's end, in a heap beside
the batch); the call's result then appends its tokens (under the version then) and the next
turn queues, its prompt the whole conversation so far, so decoding pays for the growing
context. Its prefill charges only the new tokens while the conversation's prefix is cached
(`prefix_caching`, or a kept slot), unless the weights changed meanwhile (new weights empty the
cache); a preempted or interrupted request prefills everything again. `keep_slot`: during the
call the episode keeps its slot and its KV tokens (fewer requests decode at once) and its next
turn goes to the queue's front; otherwise both are free for other requests. An abort during a
tool call keeps the call's result. Not modelled: eviction from the prefix cache (a released
conversation stays cached until the weights change).

Not modelled: speculative decoding, chunked-prefill interleaving (prefill is charged up front
when a request is admitted), and per-token sampling (lengths are drawn when a request is
submitted).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from typing import NamedTuple

Runs = tuple[tuple[int, int], ...]
"""(version, tokens) runs: which policy version produced how many tokens of a response."""


class Turns(NamedTuple):
    """A multi-turn request (an episode): the response positions where a turn ends and a tool
    call starts (every turn but the last), each call's seconds, the tokens each result appends.

    Example: turns of 300, 200, 100 model tokens with 64-token results: ends (300, 564),
    response length 728."""

    ends: tuple[int, ...]
    tool_s: tuple[float, ...]
    tool_tokens: int


class GroupSpec:
    """What the n responses of one group share; each response adds only its length (and, for
    episodes, its `Turns`)."""

    __slots__ = ("group", "prompt_len", "max_tokens", "submitted", "turns")

    def __init__(self, group: int, prompt_len: int, max_tokens: int, submitted: float,
                 turns: tuple[Turns, ...] | None = None) -> None:
        self.group, self.prompt_len, self.max_tokens, self.submitted = group, prompt_len, max_tokens, submitted
        self.turns = turns


Finished = tuple[int, Runs, float, int, bool]
"""One response: (its length in tokens, its version runs, the time it finished or was aborted,
its index in the group, whether it was aborted)."""


def extend_runs(runs: Runs, version: int, tokens: int) -> Runs:
    if tokens <= 0:
        return runs
    if runs and runs[-1][0] == version:
        return (*runs[:-1], (version, runs[-1][1] + tokens))
    return (*runs, (version, tokens))


# One running response: (finish position (of its turn, for an episode), admission order, its group,
# its length, base position, runs before this segment, tokens before this segment, its index in
# the group). Tokens generated at position S: S - base.
Running = tuple[float, int, GroupSpec, int, float, Runs, int, int]
# One waiting response: (its group, its length, runs, tokens so far, its index, prompt tokens cached).
Waiting = tuple[GroupSpec, int, Runs, int, int, int]
# An episode in a tool call: (the call's end, order, group, length, runs, tokens so far, index,
# its context's tokens, the version at the turn's end).
InTool = tuple[float, int, GroupSpec, int, Runs, int, int, int, int]


class EngineModel:
    def __init__(self, coefficients: tuple[float, float, float], prefill_s_per_token: float,
                 kv_capacity: int, max_seqs: int, watermark: float = 0.01, min_free_slots: int = 1,
                 prefix_caching: bool = True, keep_slot: bool = False) -> None:
        assert min_free_slots >= 1, min_free_slots
        self.watermark = watermark
        self.prefix_caching, self.keep_slot = prefix_caching, keep_slot
        self.min_free_slots = min_free_slots  # capped at max_seqs where it is read (retune changes it)
        self.retune(coefficients, prefill_s_per_token, kv_capacity, max_seqs)
        self.t = 0.0
        self.S = 0.0
        self.running: list[Running] = []
        self.waiting: deque[Waiting] = deque()
        self.remaining: dict[int, int] = {}
        self.done: dict[int, tuple[Finished, ...]] = {}
        self.prompt_sum = 0.0
        self.base_sum = 0.0
        self.version = 0
        self.paused = False
        self.preemptions = 0
        self.generated = 0
        self.prefilled = 0  # prompt tokens prefilled (a cached prefix is not)
        self.tools: list[InTool] = []  # heap: episodes in a tool call, by the call's end
        self.held_seqs = 0  # slots kept by episodes in a tool call (keep_slot)
        self.held_tokens = 0  # their KV tokens
        self._order = 0
        self._blocked = False  # after a preemption, admit nothing until a request finishes

    def copy(self) -> EngineModel:
        new = object.__new__(EngineModel)
        new.__dict__.update(self.__dict__)
        new.running, new.waiting, new.tools = list(self.running), deque(self.waiting), list(self.tools)
        new.remaining, new.done = dict(self.remaining), dict(self.done)
        return new

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.tools)

    def retune(self, coefficients: tuple[float, float, float], prefill_s_per_token: float,
               kv_capacity: int, max_seqs: int) -> None:
        """New speed and capacity (a different tensor-parallel size). Requests keep their
        tokens; if the cache now holds less than is running, the next `advance` preempts the
        newest until it fits."""
        self.a, self.b, self.c = coefficients
        self.prefill = prefill_s_per_token
        self.capacity = float(kv_capacity)
        self.admit_limit = kv_capacity * (1 - self.watermark)
        self.max_seqs = max_seqs

    def context_tokens(self) -> float:
        return self.prompt_sum - self.base_sum + len(self.running) * self.S

    def submit(self, spec: GroupSpec, lengths: list[int]) -> None:
        """A group of responses with these lengths (tokens) joins the queue."""
        self.waiting.extend([(spec, n, (), 0, i, 0) for i, n in enumerate(lengths)])
        self.remaining[spec.group] = self.remaining.get(spec.group, 0) + len(lengths)

    def advance(self, until: float, stop_after_group: bool = False) -> list[tuple[int, tuple[Finished, ...]]]:
        """Run to time `until` (or to the first finished group): the groups that finished.

        Between events a step at position S costs alpha + beta * S (the batch is fixed and each
        step adds one token per sequence), so going from S to S1 takes
        (S1 - S) * (alpha + beta * (S1 + S) / 2)."""
        finished: list[tuple[int, tuple[Finished, ...]]] = []
        if self.paused:
            return finished
        a, b, c, running, tools = self.a, self.b, self.c, self.running, self.tools
        while True:
            if tools and tools[0][0] <= self.t:
                self._tool_results()
            if self.waiting:
                self._admit()
            n = len(running)
            next_tool = tools[0][0] if tools else math.inf
            if not n:
                if tools and next_tool <= until:  # nothing decodes until a tool call ends
                    self.t = max(self.t, next_tool)
                    continue
                self.t = max(self.t, until)
                return finished
            if self.t >= until:  # still prefilling what it admitted
                return finished
            if next_tool <= self.t:
                continue
            S, t, head = self.S, self.t, running[0][0]
            unshared = self.prompt_sum - self.base_sum  # context tokens = unshared + n * S
            kv_full = (self.capacity - self.held_tokens - unshared) / n if n > 1 else math.inf
            target = max(head if head <= kv_full else kv_full, S)
            alpha, beta = a + b * n + c * unshared, c * n
            dt = (target - S) * (alpha + beta * (target + S) / 2)
            stop = until if until <= next_tool else next_tool
            if t + dt > stop:
                seconds, q = stop - t, alpha + beta * S
                self.S = S + 2 * seconds / (q + math.sqrt(q * q + 2 * beta * seconds))
                self.t = stop
                if stop == until:
                    return finished
                continue
            self.t, self.S = t + dt, target
            if head <= target + 1e-9:
                groups = self._complete()
                if groups:
                    finished += groups
                    if stop_after_group:
                        return finished
            else:
                self._preempt()

    def _admit(self) -> None:
        if self._blocked and self.running:
            return
        running, waiting, S = self.running, self.waiting, self.S
        slots = self.max_seqs - self.held_seqs
        if running and slots - len(running) < min(self.min_free_slots, slots, len(waiting)):
            return  # the engine's rule: decode on until enough slots are free to share one prefill
        context, tokens = self.context_tokens() + self.held_tokens, 0
        while waiting and len(running) < slots:
            spec, target, runs, done, index, cached = waiting[0]
            need = spec.prompt_len + done
            if running and context + need > self.admit_limit:
                break
            waiting.popleft()
            base = S - done
            self._order += 1
            end = target if spec.turns is None else _turn_end(spec.turns[index], done, target)
            heapq.heappush(running, (base + end, self._order, spec, target, base, runs, done, index))
            self.prompt_sum += spec.prompt_len
            self.base_sum += base
            context += need
            tokens += need - cached  # a cached prefix is not prefilled again
        self.prefilled += tokens
        self.t += tokens * self.prefill

    def _remove(self, entry: Running) -> Waiting:
        """Take `entry` out of the batch: its waiting entry, including this segment's tokens."""
        _, _, spec, target, base, runs, done, index = entry
        self.prompt_sum -= spec.prompt_len
        self.base_sum -= base
        end = target if spec.turns is None else _turn_end(spec.turns[index], done, target)
        total = min(int(self.S - base + 1e-6), end)
        self.generated += max(total - done, 0)
        return spec, target, extend_runs(runs, self.version, total - done), max(total, done), index, 0

    def _complete(self) -> list[tuple[int, tuple[Finished, ...]]]:
        """Every request whose last token is at the current position leaves the batch."""
        groups = []
        self._blocked = False
        running, done_by_group, remaining = self.running, self.done, self.remaining
        limit, version, now = self.S + 1e-9, self.version, self.t
        prompt_sum, base_sum, generated = self.prompt_sum, self.base_sum, self.generated
        while running and running[0][0] <= limit:
            _, _, spec, target, base, runs, done, index = heapq.heappop(running)
            prompt_sum -= spec.prompt_len
            base_sum -= base
            if spec.turns is not None:
                end = _turn_end(spec.turns[index], done, target)
                if end < target:  # a turn ended: its tool call starts
                    generated += end - done
                    self._tool_call(spec, target, extend_runs(runs, version, end - done), end, index, now)
                    continue
            made = target - done
            generated += made
            entry = (target, extend_runs(runs, version, made) if runs else ((version, made),), now, index, False)
            g = spec.group
            done_by_group[g] = (*done_by_group[g], entry) if g in done_by_group else (entry,)
            left = remaining[g] - 1
            if left:
                remaining[g] = left
            else:
                del remaining[g]
                groups.append((g, done_by_group.pop(g)))
        self.prompt_sum, self.base_sum, self.generated = prompt_sum, base_sum, generated
        return groups

    def _tool_call(self, spec: GroupSpec, target: int, runs: Runs, done: int, index: int, now: float) -> None:
        """An episode's turn ended at `done` tokens: it waits for its tool call (keeping its slot
        and KV with keep_slot)."""
        turns = spec.turns[index] if spec.turns is not None else None
        assert turns is not None
        context = spec.prompt_len + done
        self._order += 1
        heapq.heappush(self.tools, (now + turns.tool_s[turns.ends.index(done)], self._order, spec, target, runs,
                                    done, index, context, self.version))
        if self.keep_slot:
            self.held_seqs += 1
            self.held_tokens += context

    def _tool_result(self, call: InTool) -> Waiting:
        """A tool call ended: its result's tokens join the response (this version); the next
        turn's prefix is cached if the weights have not changed since the turn ended."""
        _, _, spec, target, runs, done, index, context, version = call
        assert spec.turns is not None
        tokens = spec.turns[index].tool_tokens
        if self.keep_slot:
            self.held_seqs -= 1
            self.held_tokens -= context
        cached = context if version == self.version and (self.prefix_caching or self.keep_slot) else 0
        return spec, target, extend_runs(runs, self.version, tokens), done + tokens, index, cached

    def _tool_results(self) -> None:
        """Every tool call that has ended by now: the next turns queue (at the front with a kept slot)."""
        tools, now = self.tools, self.t
        while tools and tools[0][0] <= now:
            entry = self._tool_result(heapq.heappop(tools))
            if self.keep_slot:
                self.waiting.appendleft(entry)
            else:
                self.waiting.append(entry)

    def _preempt(self) -> None:
        """KV cache full: the most recently admitted request goes back to the queue's front."""
        newest = max(range(len(self.running)), key=lambda i: self.running[i][1])
        entry = self.running.pop(newest)
        heapq.heapify(self.running)
        self.waiting.appendleft(self._remove(entry))
        self.preemptions += 1
        self._blocked = True

    def interrupt(self) -> int:
        """Abort every running request, keeping its tokens; it continues when stepping resumes
        (re-prefilling prompt + partial response). Returns how many were interrupted."""
        entries = sorted(self.running, key=lambda e: e[1])
        self.running = []
        for entry in reversed(entries):
            self.waiting.appendleft(self._remove(entry))
        self.prompt_sum = self.base_sum = 0.0
        return len(entries)

    def set_version(self, version: int) -> None:
        """New weights: tokens from here on carry `version`; running segments are closed."""
        entries, self.running = self.running, []
        for entry in entries:
            _, _, runs, done, index, _ = self._remove(entry)
            self.prompt_sum += entry[2].prompt_len
            self.base_sum += entry[4]
            heapq.heappush(self.running, (*entry[:5], runs, done, index))
        if any(w[5] for w in self.waiting):  # new weights empty the prefix cache
            self.waiting = deque((*w[:5], 0) for w in self.waiting)
        self.version = version

    def abort(self, group: int, indices: set[int]) -> tuple[list[Finished], list[tuple[int, tuple[Finished, ...]]]]:
        """Stop these responses of `group` where they are (running or waiting): their partials,
        and the group if that completed it (its other responses had finished)."""
        hit = [e for e in self.running if e[2].group == group and e[7] in indices]
        if hit:
            self.running = [e for e in self.running if not (e[2].group == group and e[7] in indices)]
            heapq.heapify(self.running)
        stopped = [self._remove(e) for e in hit]
        queued = [w for w in self.waiting if w[0].group == group and w[4] in indices]
        if queued:
            self.waiting = deque(w for w in self.waiting if not (w[0].group == group and w[4] in indices))
        in_tool = [c for c in self.tools if c[2].group == group and c[6] in indices]
        if in_tool:  # they keep their calls' results
            self.tools = [c for c in self.tools if not (c[2].group == group and c[6] in indices)]
            heapq.heapify(self.tools)
            queued += [self._tool_result(c) for c in in_tool]
        partials: list[Finished] = [(done, runs, self.t, index, True)
                                    for _, _, runs, done, index, _ in [*stopped, *queued]]
        if not partials:
            return [], []
        self.done[group] = (*self.done.get(group, ()), *partials)
        self.remaining[group] -= len(partials)
        if self.remaining[group]:
            return partials, []
        del self.remaining[group]
        return partials, [(group, self.done.pop(group))]


def _turn_end(turns: Turns, done: int, target: int) -> int:
    """Where the turn an episode is in (having `done` tokens) ends: the next tool call, or its end."""
    for end in turns.ends:
        if end > done:
            return end
    return target


class SimEngine:
    """An `EngineModel` on the virtual-clock event loop; one future per submitted group."""

    def __init__(self, model: EngineModel) -> None:
        self.model = model
        self._futures: dict[int, asyncio.Future[tuple[Finished, ...]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ahead: tuple[EngineModel, list[tuple[int, tuple[Finished, ...]]]] | None = None
        self._replan_pending = False

    async def generate(self, spec: GroupSpec, lengths: list[int]) -> tuple[Finished, ...]:
        """Submit one group's responses; returns when the last of them finishes."""
        self.catch_up()
        future = asyncio.get_running_loop().create_future()
        self._futures[spec.group] = future
        self.model.submit(spec, lengths)
        self._request_replan()
        return await future

    def catch_up(self) -> None:
        """Bring the model to the loop's current time (before anything changes it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._resolve(self.model.advance(asyncio.get_running_loop().time()))

    def pause(self, interrupt: bool) -> int:
        self.catch_up()
        self.model.paused = True
        return self.model.interrupt() if interrupt else 0

    def resume(self) -> None:
        self.model.paused = False
        self.model.t = max(self.model.t, asyncio.get_running_loop().time())
        self._request_replan()

    def set_version(self, version: int) -> None:
        self.catch_up()
        self.model.set_version(version)
        self._request_replan()

    def busy_for(self, seconds: float) -> None:
        """The engine does no decoding for the next `seconds` (a colocated engine waking up)."""
        self.catch_up()
        self.model.t = max(self.model.t, asyncio.get_running_loop().time() + seconds)
        self._request_replan()

    def retune(self, coefficients: tuple[float, float, float], prefill_s_per_token: float,
               kv_capacity: int, max_seqs: int) -> None:
        """`EngineModel.retune` from now on (the look-ahead made with the old numbers is dropped)."""
        self.catch_up()
        self.model.retune(coefficients, prefill_s_per_token, kv_capacity, max_seqs)
        self._request_replan()

    def abort(self, group: int, indices: set[int]) -> list[Finished]:
        """Stop these responses of `group` now; its `generate` resolves once none is left."""
        self.catch_up()
        partials, completed = self.model.abort(group, indices)
        self._resolve(completed)
        self._request_replan()
        return partials

    def _request_replan(self) -> None:
        if not self._replan_pending:
            self._replan_pending = True
            asyncio.get_running_loop().call_soon(self._replan)

    def _replan(self) -> None:
        self._replan_pending = False
        self.catch_up()
        if self.model.paused or not self.model.busy:
            return
        ahead = self.model.copy()
        finished = ahead.advance(math.inf, stop_after_group=True)
        if finished:
            self._ahead = (ahead, finished)
            self._timer = asyncio.get_running_loop().call_at(ahead.t, self._fire)

    def _fire(self) -> None:
        assert self._ahead is not None
        self._timer = None
        self.model, finished = self._ahead
        self._ahead = None
        self._resolve(finished)
        self._replan()

    def _resolve(self, finished: list[tuple[int, tuple[Finished, ...]]]) -> None:
        for group, results in finished:
            future = self._futures.pop(group, None)
            if future is not None and not future.done():
                future.set_result(results)
