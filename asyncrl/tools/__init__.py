"""Tools for multi-turn episodes: calls parsed from model output, a registry, built-in tools.

Typical use:
    tools = ToolRegistry.from_config(cfg.rollout.multi_turn.tool_config_path, sandbox=cfg.sandbox)
    calls, errors = parse_tool_calls(text, cfg.rollout.multi_turn.format)
    result = await tools.run(calls[0], timeout_s=10.0, max_chars=256)  # ToolResult(text, status, seconds, ...)

See docs/tools.md. Not here: the episode that alternates model turns and tool calls (`asyncrl.agents`).
"""

from asyncrl.tools.builtins import ToolFailure, ToolTimeout, calculate
from asyncrl.tools.calls import RAW_ARGUMENT, ToolCall, ToolResult, parse_tool_calls
from asyncrl.tools.definitions import CALCULATOR_SCHEMA, PYTHON_SCHEMA, Tool, function_tool
from asyncrl.tools.registry import ToolRegistry

__all__ = ["CALCULATOR_SCHEMA", "PYTHON_SCHEMA", "RAW_ARGUMENT", "Tool", "ToolCall", "ToolFailure", "ToolRegistry",
           "ToolResult", "ToolTimeout", "calculate", "function_tool", "parse_tool_calls"]
