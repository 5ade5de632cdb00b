"""The tool registry: verl's tool config YAML, schemas a chat template renders, and `run` answering
every call (unknown tools, bad arguments, tools that raise, hang or flood) without raising."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.errors import ConfigError
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.tools.builtins import ToolFailure
from asyncrl.tools.calls import RAW_ARGUMENT, TRUNCATED, ToolCall, ToolResult, parse_tool_calls
from asyncrl.tools.definitions import CALCULATOR_SCHEMA, PYTHON_SCHEMA, Tool, function_tool
from asyncrl.tools.registry import ToolRegistry

SANDBOX = SandboxConfig(backend="rlimit", memory_mb=512, tmp_mb=8, max_output_kb=64, max_processes=16)
KEY = "rollout.multi_turn.tool_config_path"

# A chat template in the Qwen2.5 style, written for this test: the schemas as JSON lines inside
# <tools>, an assistant's tool_calls as hermes <tool_call> blocks, tool results in <tool_response>.
QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\nYou can call these functions:\n<tools>\n"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def run(tools: ToolRegistry, call: ToolCall, timeout_s: float = 5.0, max_chars: int = 100) -> ToolResult:
    return asyncio.run(tools.run(call, timeout_s=timeout_s, max_chars=max_chars))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


VERL_LAYOUT = """\
    tools:
      - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
        config: {"sandbox_fusion_url": "http://localhost:8080/run_code", "type": "native"}
        tool_schema:
          type: "function"
          function:
            name: "code_interpreter"
            description: "A tool for executing code."
            parameters:
              type: "object"
              properties:
                code: {type: "string", description: "The code to execute."}
              required: ["code"]
      - class_name: calculator
        config: {}
      - class_name: "tools_c_user:shout"
        config: {type: native}
        tool_schema:
          type: function
          function:
            name: shout
            description: "Upper-cases text, a number of times."
            parameters:
              type: object
              properties:
                text: {type: string}
                times: {type: integer}
              required: [text]
"""


def test_verl_layout_yaml_maps_onto_the_builtins_and_a_user_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "tools_c_user.py").write_text("def shout(text, times=1):\n    return text.upper() * times\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = ToolRegistry.from_config(write(tmp_path, VERL_LAYOUT), sandbox=SANDBOX)
    assert tools.names == ["code_interpreter", "calculator", "shout"]
    assert tools.schemas()[1] == CALCULATOR_SCHEMA
    assert tools.schemas()[0]["function"]["description"] == "A tool for executing code."
    calls, _ = parse_tool_calls('<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(3*5)"}}'
                                '</tool_call><tool_call>{"name": "shout", "arguments": {"text": "hi", "times": 2}}'
                                "</tool_call>", "hermes")
    assert (run(tools, calls[0]).text, run(tools, calls[0]).status) == ("15\n", "ok")
    assert run(tools, calls[1]).text == "HIHI"
    compact, _ = parse_tool_calls("<tool_call>code_interpreter print(2)</tool_call>", "compact")
    assert run(tools, compact[0]).text == "2\n"  # the text fills the one required string parameter


def test_empty_path_is_the_builtins():
    tools = ToolRegistry.from_config("", sandbox=SANDBOX)
    assert tools.schemas() == [CALCULATOR_SCHEMA, PYTHON_SCHEMA]
    assert run(tools, ToolCall("calculator", {"expression": "2**64 + 1"}, "")).text == str(2**64 + 1)


@pytest.mark.parametrize(("yaml_text", "problem"), [
    ("tools: [\n", "not valid YAML"),
    ("tools: []\n", "expected a non-empty list under 'tools:'"),
    ("- class_name: calculator\n", "expected a non-empty list under 'tools:'"),
    ("tools:\n  - config: {}\n", "tools[0] needs a class_name"),
    ("tools:\n  - class_name: verl.tools.search_tool.SearchTool\n", "tools[0].class_name='verl.tools.search_tool"
                                                                      ".SearchTool' is not a tool asyncrl has"),
    ("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n", "scores an answer against the row's ground truth"),
    ("tools:\n  - class_name: python\n    config: {type: mcp}\n", "tools[0].config.type='mcp': only native"),
    ("tools:\n  - class_name: calculator\n    config: [1]\n", "tools[0].config must be a mapping"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {function: {name: calc}}\n",
     "tools[0].tool_schema must be {type: function"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {type: function, function: {name: a b}}\n",
     "function.name must be a name without spaces"),
    ("tools:\n  - class_name: python\n    tool_schema: {type: function, function: {name: py, parameters: "
     "{type: object, properties: {n: {type: integer}}, required: [n]}}}\n",
     "the built-in python tool needs exactly one required string parameter"),
    ("tools:\n  - class_name: calculator\n  - class_name: calculator\n", "two tools are named 'calculator'"),
    ("tools:\n  - class_name: 'tools_c_missing:f'\n", "cannot import 'tools_c_missing'"),
    ("tools:\n  - class_name: 'json:no_such_function'\n", "'json' has no function 'no_such_function'"),
    ("tools:\n  - class_name: 'json:dumps'\n", "tools[0] needs a tool_schema"),
])
def test_a_bad_tool_config_is_one_line_naming_the_key(tmp_path: Path, yaml_text: str, problem: str):
    path = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as info:
        ToolRegistry.from_config(path, sandbox=SANDBOX)
    message = str(info.value)
    assert message.startswith(f"{KEY}={path!r}: ") and "\n" not in message
    assert problem in message


def test_a_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match=f"^{KEY}=.*cannot read it"):
        ToolRegistry.from_config(str(tmp_path / "nope.yaml"), sandbox=SANDBOX)


def test_schemas_render_in_a_chat_template_and_its_tool_calls_parse_back():
    tools = ToolRegistry([function_tool(lambda expression: expression, CALCULATOR_SCHEMA)])
    tok = build_char_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tools=tools.schemas(),
                                     chat_template=QWEN_STYLE, tokenize=False, add_generation_prompt=True)
    assert f"<tools>\n{json.dumps(CALCULATOR_SCHEMA, ensure_ascii=False)}\n</tools>" in prompt
    wanted = [{"expression": "2+3"}, {"expression": "12345678901234567890 * 3"}]
    turn = {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": args}} for args in wanted]}
    rendered = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}, turn], tools=tools.schemas(),
                                       chat_template=QWEN_STYLE, tokenize=False)
    calls, errors = parse_tool_calls(rendered.rpartition("<|im_start|>assistant\n")[2], "hermes")
    assert errors == [] and [(c.name, c.arguments) for c in calls] == [("calculator", a) for a in wanted]


def _schema(name: str, properties: dict[str, Any] | None = None, required: tuple[str, ...] = ()) -> dict[str, Any]:
    params = {"type": "object", "properties": properties or {}, "required": list(required)}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


def _raise(exc: Exception) -> Any:
    raise exc


async def _hang(_args: dict[str, Any], _timeout_s: float) -> str:
    await asyncio.sleep(3600)
    return "never"


FAKES = ToolRegistry([
    Tool(_schema("boom"), lambda _a, _t: _raise(KeyError("x"))),
    Tool(_schema("refuse"), lambda _a, _t: _raise(ToolFailure("I refuse"))),
    Tool(_schema("hang"), _hang),
    Tool(_schema("stuck"), lambda _a, _t: time.sleep(0.2)),
    Tool(_schema("flood"), lambda _a, _t: "z" * 100_000),
    function_tool(lambda: None, _schema("nothing")),
    function_tool(lambda a, n=1: a * n, _schema("repeat", {"a": {"type": "string"}, "n": {"type": "integer"}},
                                                ("a",))),
])


@pytest.mark.parametrize(("call", "status", "text"), [
    (ToolCall("nope", {}, ""), "unknown_tool",
     "unknown tool 'nope': the tools are boom, refuse, hang, stuck, flood, nothing, repeat"),
    (ToolCall("boom", {}, ""), "error", "boom failed: KeyError: 'x'"),
    (ToolCall("refuse", {}, ""), "error", "I refuse"),
    (ToolCall("hang", {}, ""), "timeout", "timeout: hang ran past 0.05 s"),
    (ToolCall("stuck", {}, ""), "timeout", "timeout: stuck ran past 0.05 s"),
    (ToolCall("flood", {}, ""), "ok", "z" * 100 + TRUNCATED),
    (ToolCall("nothing", {}, ""), "ok", ""),
    (ToolCall("repeat", {"a": "ab", "n": 3}, ""), "ok", "ababab"),
    (ToolCall("repeat", {RAW_ARGUMENT: "ab"}, ""), "ok", "ab"),
    (ToolCall("repeat", {"n": 3}, ""), "bad_call", "bad call to repeat: missing argument 'a'"),
    (ToolCall("repeat", {"a": "ab", "n": "3"}, ""), "bad_call", "bad call to repeat: argument 'n' must be integer, "
                                                                "got str"),
    (ToolCall("repeat", {"a": "ab", "n": True}, ""), "bad_call", "bad call to repeat: argument 'n' must be integer, "
                                                                 "got bool"),
    (ToolCall("repeat", {"a": "ab", "m": 3}, ""), "bad_call", "bad call to repeat: unexpected argument 'm' (the "
                                                              "arguments are a, n)"),
    (ToolCall("nothing", {RAW_ARGUMENT: "x"}, ""), "bad_call", "bad call to nothing: takes named arguments (none), "
                                                               "not one text argument"),
])
def test_run_answers_every_call_without_raising(call: ToolCall, status: str, text: str):
    result = run(FAKES, call, timeout_s=0.05)
    assert (result.status, result.text, result.truncated) == (status, text, status == "ok" and call.name == "flood")


def test_calls_run_concurrently_and_each_gets_its_own_answer():
    async def many() -> list[ToolResult]:
        calls = [ToolCall("repeat", {"a": str(k), "n": k}, "") for k in range(1, 9)]
        return await asyncio.gather(*(FAKES.run(c, timeout_s=5.0, max_chars=100) for c in calls))

    assert [r.text for r in asyncio.run(many())] == [str(k) * k for k in range(1, 9)]


def test_a_sandbox_that_cannot_run_fails_at_start_up_naming_its_key():
    with pytest.raises(ConfigError, match="sandbox.backend=http needs sandbox.url"):
        ToolRegistry.from_config("", sandbox=SandboxConfig(backend="http"))
