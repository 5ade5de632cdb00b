"""Episode metrics against hand-computed numbers."""

from __future__ import annotations

import pytest

from asyncrl.agents.metrics import episode_metrics
from asyncrl.telemetry.metrics import group_metrics
from asyncrl.types import Group, PromptRow, Trajectory


def traj(episode: dict[str, float]) -> Trajectory:
    return Trajectory("r", (1,), [2, 3], [-0.1, 0.0], [0, 0], "stop", loss_mask=[1, 0] if episode else (),
                      episode=episode)


def test_episode_metrics_by_hand():
    a = traj({"num_turns": 3, "user_turns": 2, "tool_calls": 3, "tool_time_s": 0.6, "tool_errors": 1,
              "tool_truncated": 1, "tool_limited": 2})
    b = traj({"num_turns": 1})
    m = episode_metrics([a, b])
    assert m["num_turns/min"] == 2 and m["num_turns/max"] == 6 and m["num_turns/mean"] == 4  # messages, as verl
    assert m["num_turns/assistant_mean"] == 2 and m["tool_calls/mean"] == 1.5 and m["tool_calls/max"] == 3
    assert m["tool_calls/errors"] == 1 and m["tool_calls/truncated"] == 1 and m["tool_calls/limited"] == 2
    assert m["tool_calls/time_s"] == pytest.approx(0.6, rel=1e-9, abs=1e-12)
    assert m["tool_calls/time_s_mean"] == pytest.approx(0.2, rel=1e-9, abs=1e-12)


def test_single_turn_groups_have_no_episode_metrics():
    row = PromptRow(uid="p", data_source="x", messages=(), ground_truth="")
    assert not any(k.startswith(("num_turns/", "tool_calls/")) for k in group_metrics([Group("g", row, [traj({})])], 8))
    assert group_metrics([Group("g", row, [traj({"num_turns": 1})])], 8)["num_turns/mean"] == 2
