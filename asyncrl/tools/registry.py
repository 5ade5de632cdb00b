"""The tools an episode may call: their OpenAI function schemas, and running one call safely.

Typical use (the built-in tool episode):
    tools = ToolRegistry.from_config(mt.tool_config_path, sandbox=cfg.sandbox)  # "" = calculator, python
    prompt = tok.apply_chat_template(messages, tools=tools.schemas(), add_generation_prompt=True)
    calls, errors = parse_tool_calls(turn_text, mt.format)
    result = await tools.run(calls[0], timeout_s=mt.tool_timeout_s, max_chars=mt.max_tool_response_length)

`run` never raises (cancellation aside): an unknown tool, arguments that do not fit the schema, a
tool that raises, hangs past `timeout_s` or floods become a `ToolResult` with a status, and the
output is cut to `max_chars` characters (head kept, "...(truncated)" appended, as verl's
`max_tool_response_length`). A synchronous tool runs in a worker thread; past its deadline it is
left to finish there, so a tool that can hang must stop itself (the python tool's sandbox kills
the program at `timeout_s`).

The YAML layout is verl's (`asyncrl.tools.definitions` reads it). Not here: parsing calls from text
(`asyncrl.tools.calls`), the tools' own code (`asyncrl.tools.builtins`).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.tools.builtins import ToolFailure, ToolTimeout
from asyncrl.tools.calls import RAW_ARGUMENT, ToolCall, ToolResult, truncate
from asyncrl.tools.definitions import Tool, calculator_tool, load_tools, python_tool, text_parameter


class BadCall(ValueError):
    """The arguments do not fit the tool's schema (status "bad_call")."""


class ToolRegistry:
    """Tools by name; `run` executes one call and always answers."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        assert len(self._tools) == len(tools), f"duplicate tool names in {[t.name for t in tools]}"

    @classmethod
    def builtins(cls, sandbox: SandboxConfig) -> ToolRegistry:
        return cls([calculator_tool(), python_tool(sandbox)])

    @classmethod
    def from_config(cls, path: str, *, sandbox: SandboxConfig) -> ToolRegistry:
        """The tools of a verl-layout YAML (`rollout.multi_turn.tool_config_path`); "" = the built-ins.

        Raises ConfigError (one line naming the key) for a missing or malformed file or an unknown tool."""
        if not path:
            return cls.builtins(sandbox)
        return cls(load_tools(path, sandbox))

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI function schemas, for `tokenizer.apply_chat_template(messages, tools=...)`."""
        return [copy.deepcopy(tool.schema) for tool in self._tools.values()]

    async def run(self, call: ToolCall, *, timeout_s: float, max_chars: int) -> ToolResult:
        """Run one call to its end, its failure or its timeout; never raises."""
        start = time.monotonic()
        text, status = await self._outcome(call, timeout_s)
        text, cut = truncate(text, max_chars)
        return ToolResult(text, status, time.monotonic() - start, cut)

    async def _outcome(self, call: ToolCall, timeout_s: float) -> tuple[str, str]:
        tool = self._tools.get(call.name)
        if tool is None:
            return f"unknown tool {call.name!r}: the tools are {', '.join(self._tools) or '(none)'}", "unknown_tool"
        try:
            arguments = bind(call.arguments, tool.schema)
        except BadCall as exc:
            return f"bad call to {call.name}: {exc}", "bad_call"
        try:
            return await asyncio.wait_for(_invoke(tool, arguments, timeout_s), timeout_s + tool.grace_s), "ok"
        except ToolTimeout as exc:
            return str(exc), "timeout"
        except asyncio.TimeoutError:
            return f"timeout: {call.name} ran past {timeout_s:g} s", "timeout"
        except ToolFailure as exc:
            return str(exc) or f"{call.name} failed", "error"
        except Exception as exc:  # a tool can fail in any way; the model reads why
            return f"{call.name} failed: {type(exc).__name__}: {exc}", "error"


async def _invoke(tool: Tool, arguments: dict[str, Any], timeout_s: float) -> str:
    if inspect.iscoroutinefunction(tool.fn):
        return str(await tool.fn(arguments, timeout_s))
    return str(await asyncio.to_thread(functools.partial(tool.fn, arguments, timeout_s)))


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def bind(arguments: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, checked against the schema (names, required, JSON types)."""
    params = schema["function"].get("parameters") or {}
    properties: dict[str, Any] = params.get("properties") or {}
    if set(arguments) == {RAW_ARGUMENT}:
        name = text_parameter(schema)
        if name is None:
            raise BadCall(f"takes named arguments ({', '.join(properties) or 'none'}), not one text argument")
        arguments = {name: arguments[RAW_ARGUMENT]}
    missing = [name for name in params.get("required") or [] if name not in arguments]
    if missing:
        raise BadCall(f"missing argument {missing[0]!r}")
    for name, value in arguments.items():
        if properties and name not in properties:
            raise BadCall(f"unexpected argument {name!r} (the arguments are {', '.join(properties)})")
        wanted = (properties.get(name) or {}).get("type")
        kinds = wanted if isinstance(wanted, list) else [wanted] if wanted else []
        if kinds and not any(_JSON_TYPES.get(kind, lambda _v: True)(value) for kind in kinds):
            raise BadCall(f"argument {name!r} must be {' or '.join(map(str, kinds))}, got {type(value).__name__}")
    return arguments
