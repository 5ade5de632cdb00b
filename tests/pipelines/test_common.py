"""What every pipeline does after a step: a multi-turn run without tool calls says so, once."""

from __future__ import annotations

from types import SimpleNamespace

from asyncrl.config.load import load_config
from asyncrl.pipelines.common import NO_TOOL_STEPS, check_tool_calls


def test_a_multi_turn_run_without_tool_calls_names_tiny_tools() -> None:
    lines: list[str] = []
    ctx = SimpleNamespace(cfg=load_config(None, ["rollout.multi_turn.enable=true"]), tool_calls=0.0, log=lines.append)
    for step in range(NO_TOOL_STEPS + 3):
        check_tool_calls(ctx, step, {"tool_calls/mean": 0.0})  # type: ignore[arg-type]
    assert len(lines) == 1 and lines[0].startswith(f"warning: no tool call in {NO_TOOL_STEPS} steps")
    assert "model.path=tiny-tools" in lines[0]
    calling = SimpleNamespace(cfg=ctx.cfg, tool_calls=0.0, log=lines.append)
    for step, calls in enumerate([0.0, 0.0, 0.5, 0.0], start=1):
        check_tool_calls(calling, step, {"tool_calls/mean": calls})  # type: ignore[arg-type]
    assert len(lines) == 1  # a model that called a tool: nothing to say
