"""Multi-turn episodes in the simulator (`rollout.multi_turn.enable`): an `EpisodePlan` as the
engine's `Turns`, and the loss mask and counters of the trajectory it becomes.

An episode's response is laid out as its turns' model tokens with each tool result's tokens
between two turns: [turn 1][tool 1][turn 2][tool 2]...[turn K]. The engine (`EngineModel`) runs
the whole episode as one request that leaves the batch at each turn's end for its tool call
(virtual time), comes back with the result appended and prefills only the new tokens while the
conversation stays cached; this module only translates. A trajectory's per-token versions come
from the engine (tool tokens carry the version when the result arrived; a turn interrupted by a
sync continues under the new version, as a partial response does), so staleness and partial
rollout are accounted per episode by the pipelines' own code.

A stopped episode (an abort: a partial) continues from where it stopped, the rest laid out by a
fresh plan from that position on (as a partial single-turn response continues for its fresh
length minus what it has); its mask and counters are the two parts joined.

Not modelled: tool calls that fail other than by timing out, truncated tool output, user turns.
"""

from __future__ import annotations

from asyncrl.sim.engine import Turns
from asyncrl.sim.workload import EpisodePlan
from asyncrl.types import RunLength, Trajectory

Segments = tuple[tuple[int, int], ...]
"""(1 model / 0 tool, tokens) runs: a loss mask as runs."""


def layout(plan: EpisodePlan) -> Segments:
    """The response's segments. Example: turns (300, 200), 64-token results: ((1, 300), (0, 64), (1, 200))."""
    out: list[tuple[int, int]] = []
    for k, n in enumerate(plan.turns_T):
        if k:
            out.append((0, plan.tool_tokens))
        out.append((1, n))
    return tuple(out)


def response_tokens(plan: EpisodePlan) -> int:
    """Model and tool tokens of the whole episode."""
    return sum(plan.turns_T) + (len(plan.turns_T) - 1) * plan.tool_tokens


def engine_turns(plan: EpisodePlan, offset: int = 0) -> tuple[int, Turns]:
    """(response tokens to generate, the engine's `Turns`) of `plan` from response position
    `offset` on (0, or what a stopped episode already has).

    Example: turns (300, 200, 100), 64-token results: (728, Turns((300, 564), ...)); from 400 on:
    (328, Turns((164,), the second call only, 64))."""
    ends: list[int] = []
    pos = 0
    for n in plan.turns_T[:-1]:
        pos += n
        ends.append(pos)
        pos += plan.tool_tokens
    total = pos + plan.turns_T[-1]
    later = [(end - offset, s) for end, s in zip(ends, plan.tool_s) if end > offset]
    return max(total - offset, 1), Turns(tuple(e for e, _ in later), tuple(s for _, s in later), plan.tool_tokens)


def mask_and_counters(plan: EpisodePlan, start: int, stop: int) -> tuple[Segments, dict[str, float]]:
    """The loss mask runs and episode counters of the response positions [start, stop) of `plan`.

    Example: turns (300, 200), 64-token results, [0, 400): mask ((1, 300), (0, 64), (1, 36)),
    num_turns 2, tool_calls 1."""
    mask: list[tuple[int, int]] = []
    counters = {"num_turns": 0.0, "tool_calls": 0.0, "tool_errors": 0.0, "tool_time_s": 0.0,
                "tool_truncated": 0.0, "user_turns": 0.0}
    pos = 0
    for k, (flag, n) in enumerate(layout(plan)):
        lo, hi = max(pos, start), min(pos + n, stop)
        called = not flag and start <= pos < stop  # a result of 0 tokens still made a call
        pos += n
        if hi <= lo and not called:
            continue
        mask = _extend(mask, flag, hi - lo)
        if flag:
            counters["num_turns"] += 1
        else:
            call = k // 2
            counters["tool_calls"] += 1
            counters["tool_errors"] += plan.timeouts[call]
            counters["tool_time_s"] += plan.tool_s[call]
    if stop > pos:  # a continuation's first length is at least one token
        mask = _extend(mask, 1, stop - max(pos, start))
    return tuple(mask), counters


def fill(t: Trajectory, plan: EpisodePlan, offset: int) -> None:
    """Set the loss mask, counters and finish reason of `t`, the part of an episode from position
    `offset` on."""
    n = len(t.response_ids)
    mask, t.episode = mask_and_counters(plan, offset, offset + n)
    t.loss_mask = RunLength(mask, n)
    if t.finish_reason != "aborted":
        t.finish_reason = "length" if plan.truncated else "stop"


def join(before: Trajectory, rest: Trajectory) -> tuple[RunLength[int], dict[str, float]]:
    """The loss mask and counters of a stopped episode `before` continued by `rest`: masks
    concatenated, counters added (a turn split by the stop counted once)."""
    head = _runs(before)
    mask = list(head)
    for flag, n in _runs(rest):
        mask = _extend(mask, flag, n)
    counters = {k: before.episode.get(k, 0.0) + v for k, v in rest.episode.items()}
    if head and rest.loss_mask and head[-1][0] == 1 and _runs(rest)[0][0] == 1:
        counters["num_turns"] -= 1
    return RunLength(tuple(mask), len(before.response_ids) + len(rest.response_ids)), counters


def _runs(t: Trajectory) -> Segments:
    m = t.loss_mask
    if isinstance(m, RunLength):
        return tuple(m.runs)
    if not m:  # every token the model's
        return ((1, len(t.response_ids)),) if len(t.response_ids) else ()
    out: list[tuple[int, int]] = []
    for flag in m:
        out = _extend(out, int(flag), 1)
    return tuple(out)


def _extend(runs: list[tuple[int, int]], flag: int, n: int) -> list[tuple[int, int]]:
    if n <= 0:
        return runs
    if runs and runs[-1][0] == flag:
        runs[-1] = (flag, runs[-1][1] + n)
    else:
        runs.append((flag, n))
    return runs
