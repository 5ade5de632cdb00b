"""Tool calls read from model output: the hermes JSON blocks and the compact form, malformed included."""

from __future__ import annotations

import json

from asyncrl.tools.calls import RAW_ARGUMENT, TRUNCATED, ToolCall, parse_tool_calls, truncate


def hermes(name: str, arguments: object) -> str:
    """A call as the Qwen2.5/Qwen3 templates write one: the JSON on its own line between the tags."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_hermes_reads_several_calls_in_one_turn_in_order():
    first, second = hermes("calculator", {"expression": "2+3"}), hermes("python", {"code": "print(1)"})
    text = f"Let me compute.\n{first}\n{second}"
    calls, errors = parse_tool_calls(text, "hermes")
    assert errors == []
    assert calls == [ToolCall("calculator", {"expression": "2+3"}, first),
                     ToolCall("python", {"code": "print(1)"}, second)]


def test_hermes_text_without_calls_has_none():
    assert parse_tool_calls("The answer is 5.", "hermes") == ([], [])


def test_hermes_arguments_written_as_a_string():
    encoded = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    plain = '<tool_call>{"name": "calculator", "arguments": "1+1"}</tool_call>'
    assert parse_tool_calls(encoded, "hermes")[0][0].arguments == {"expression": "1+1"}
    assert parse_tool_calls(plain, "hermes")[0][0].arguments == {RAW_ARGUMENT: "1+1"}


def test_hermes_malformed_blocks_are_errors_and_the_good_ones_still_count():
    good = hermes("calculator", {"expression": "1"})
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"</tool_call>'  # JSON cut short
            f'{good}'
            '<tool_call>["calculator"]</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "python", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}')  # never closed
    calls, errors = parse_tool_calls(text, "hermes")
    assert [c.name for c in calls] == ["calculator"]
    assert len(errors) == 5
    assert errors[0].startswith("tool call 1: invalid JSON")
    assert errors[1] == 'tool call 3: expected a JSON object {"name": ..., "arguments": {...}}, got list'
    assert errors[2] == 'tool call 4: no "name" (a string) in the call'
    assert errors[3] == 'tool call 5: "arguments" must be a JSON object, got list'
    assert errors[4] == "tool call 6: <tool_call> without </tool_call>"


def test_compact_name_then_the_rest_as_one_argument():
    code = "x = 2\nfor i in range(3):\n    x *= x\nprint(x)"
    text = f"<tool_call>calculator 123 + 456</tool_call> and <tool_call>python {code}\n</tool_call>"
    calls, errors = parse_tool_calls(text, "compact")
    assert errors == []
    first = "<tool_call>calculator 123 + 456</tool_call>"
    assert calls[0] == ToolCall("calculator", {RAW_ARGUMENT: "123 + 456"}, first)
    assert calls[1].name == "python" and calls[1].arguments == {RAW_ARGUMENT: code}


def test_compact_malformed():
    calls, errors = parse_tool_calls("<tool_call>now</tool_call><tool_call>  </tool_call><tool_call>calculator 1",
                                     "compact")
    assert calls == [ToolCall("now", {}, "<tool_call>now</tool_call>")]  # no argument: the registry says bad_call
    assert errors == ["tool call 2: empty call: expected <tool_call>NAME ARGUMENT</tool_call>",
                      "tool call 3: <tool_call> without </tool_call>"]


def test_truncate_keeps_the_head_and_marks_the_cut():
    assert truncate("abc", 3) == ("abc", False)
    assert truncate("abcdef", 4) == ("abcd" + TRUNCATED, True)
