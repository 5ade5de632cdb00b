"""Per-step metrics of multi-turn episodes, from the counters on their trajectories.

verl's names where verl has them: `num_turns/min|max|mean` counts, as verl's agent loop does,
every message of the conversation (assistant turns + tool/user turns + the prompt). The others
are ours: `num_turns/assistant_mean` (model turns), `tool_calls/mean|max` per episode,
`tool_calls/errors`, `tool_calls/truncated` and `tool_calls/limited` (refused past
max_tool_calls) summed over the step, `tool_calls/turn_limited` (episodes ended by a turn
limit), `tool_calls/time_s` (tool seconds summed) and `tool_calls/time_s_mean` (per call);
an agent's counters (`agent/calls`, `agent/chains`, `agent/retokenized_tokens`, ...) summed.
Single-turn trajectories (no counters) yield nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.types import Trajectory


def episode_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Example: two episodes with counters {num_turns 2, user_turns 1, tool_calls 1, tool_time_s 0.5}
    and {num_turns 1} -> num_turns/mean 3.0 (4 and 2 messages), tool_calls/mean 0.5,
    tool_calls/time_s 0.5, tool_calls/time_s_mean 0.5."""
    episodes = [t.episode for t in trajs if t.episode]
    if not episodes:
        return {}
    turns = [e.get("num_turns", 0.0) + e.get("user_turns", 0.0) + 1 for e in episodes]
    calls = [e.get("tool_calls", 0.0) for e in episodes]

    def total(key: str) -> float:
        return float(sum(e.get(key, 0.0) for e in episodes))

    n = len(episodes)
    return {"num_turns/min": min(turns), "num_turns/max": max(turns), "num_turns/mean": sum(turns) / n,
            "num_turns/assistant_mean": total("num_turns") / n,
            "tool_calls/mean": sum(calls) / n, "tool_calls/max": max(calls),
            "tool_calls/errors": total("tool_errors"), "tool_calls/truncated": total("tool_truncated"),
            "tool_calls/limited": total("tool_limited"), "tool_calls/turn_limited": total("turn_limited"),
            "tool_calls/time_s": total("tool_time_s"),
            "tool_calls/time_s_mean": total("tool_time_s") / max(sum(calls), 1.0)} | {
                k: total(k) for k in sorted({k for e in episodes for k in e if k.startswith("agent/")})}
