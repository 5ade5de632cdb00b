"""Tool calls read from a model's output, and what a tool answers.

Two written forms, chosen by `rollout.multi_turn.format`:
- hermes (verl's default `format: hermes`; what the Qwen2.5/Qwen3 chat templates write for an
  assistant message with `tool_calls`): one JSON object per block,
  `<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>`;
- compact (for a small model whose template holds no JSON): `<tool_call>NAME ARGUMENT</tool_call>`,
  e.g. `<tool_call>calculator 1+2</tool_call>`. ARGUMENT (the rest of the block) is kept under
  `RAW_ARGUMENT`; the registry hands it to the tool's single required string parameter.

A turn may hold several calls. A block that cannot be read becomes a parse error string (the
episode tells the model and counts it), never an exception. Text outside the blocks is ignored.
Not here: which tools exist and running them (`asyncrl.tools.registry`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from asyncrl.config.names import ToolCallFormat

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RAW_ARGUMENT = "__argument__"
"""The key of a call's one unnamed argument (compact form, or a hermes `arguments` that is plain text)."""
TRUNCATED = "...(truncated)"
"""Appended to a tool's output cut at max_chars (verl's marker)."""

_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_COMPACT = re.compile(r"\s*(\S+)(?:\s+(.*?))?\s*", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    """The tool's name as the model wrote it."""
    arguments: dict[str, Any]
    """Its arguments by parameter name (or `{RAW_ARGUMENT: text}` for an unnamed one)."""
    text: str
    """The raw call as written, tags included."""


@dataclass(frozen=True)
class ToolResult:
    text: str
    """What the model reads back: the tool's output, or a one-line reason it has none."""
    status: str
    """ok | error (the tool failed) | timeout | unknown_tool | bad_call (arguments don't fit) | limit."""
    seconds: float
    """Wall time of the call."""
    truncated: bool = False
    """The output was longer than max_chars and was cut."""


def parse_tool_calls(text: str, fmt: ToolCallFormat) -> tuple[list[ToolCall], list[str]]:
    """The calls in one assistant turn, in order, and a message per block that could not be read.

    Example: parse_tool_calls('<tool_call>calculator 2+3</tool_call>', "compact")
    -> ([ToolCall("calculator", {RAW_ARGUMENT: "2+3"}, "<tool_call>calculator 2+3</tool_call>")], [])
    """
    assert fmt in ("hermes", "compact"), fmt
    calls: list[ToolCall] = []
    errors: list[str] = []
    end = 0
    for n, match in enumerate(_BLOCK.finditer(text), start=1):
        end = match.end()
        body = match.group(1)
        call, error = _hermes(body, match.group(0)) if fmt == "hermes" else _compact(body, match.group(0))
        if call is not None:
            calls.append(call)
        else:
            errors.append(f"tool call {n}: {error}")
    if OPEN in text[end:]:
        errors.append(f"tool call {len(calls) + len(errors) + 1}: {OPEN} without {CLOSE}")
    return calls, errors


def _hermes(body: str, raw: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(obj, dict):
        return None, f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'no "name" (a string) in the call'
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, or plain text
        arguments = _decoded(arguments)
    if not isinstance(arguments, dict):
        return None, f'"arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name, arguments, raw), ""


def _decoded(arguments: str) -> Any:
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError:
        return {RAW_ARGUMENT: arguments}
    return decoded if isinstance(decoded, dict) else {RAW_ARGUMENT: arguments}


def _compact(body: str, raw: str) -> tuple[ToolCall | None, str]:
    match = _COMPACT.fullmatch(body)
    if match is None:
        return None, f"empty call: expected {OPEN}NAME ARGUMENT{CLOSE}"
    name, argument = match.group(1), match.group(2)
    return ToolCall(name, {} if argument is None else {RAW_ARGUMENT: argument}, raw), ""


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """The head of `text` up to max_chars characters, marked when cut (as verl's tool responses)."""
    assert max_chars >= 1, max_chars
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + TRUNCATED, True
