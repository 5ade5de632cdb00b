"""What a tool is (`Tool`: a schema and a function), the built-in ones, and verl's tool config YAML.

The YAML (`rollout.multi_turn.tool_config_path`) is verl's layout:

    tools:
      - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool   # -> the built-in python tool
        config: {type: native}                                          # verl's own keys, not used here
        tool_schema:
          type: function
          function: {name: code_interpreter, description: ..., parameters: {type: object, ...}}

`class_name` picks the code: a built-in by our name (`calculator`, `python`, or
`asyncrl.tools.calculator` / `asyncrl.tools.python`), verl's code interpreter
(`...SandboxFusionTool`, run in our sandbox under `sandbox.*`: its `sandbox_fusion_url` is not
used), or a user's function as `"package.module:function"`, called with the arguments as
keywords and its value returned as text. `tool_schema` is what the model sees (a built-in keeps
its default when it is left out; a user's function needs one). A built-in runs under the schema's
name and reads its one required string parameter (the code, the expression), whatever it is called.
Anything else, verl's reward-like tools (Gsm8kTool) and `config.type: mcp` included, is a
ConfigError naming the key. Not here: running calls (`asyncrl.tools.registry`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.errors import ConfigError
from asyncrl.rewards.sandbox import SandboxError, sandbox_for
from asyncrl.tools.builtins import calculate, run_python

log = logging.getLogger("asyncrl.tools")
KEY = "rollout.multi_turn.tool_config_path"
SANDBOX_GRACE_S = 5.0
"""Seconds past timeout_s the registry waits for a sandboxed run (start-up and kill) before giving up on it."""

CALCULATOR_SCHEMA: dict[str, Any] = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": "The expression, e.g. 123456789012345678901 + 987654321098765432109"}},
        "required": ["expression"]}}}
PYTHON_SCHEMA: dict[str, Any] = {"type": "function", "function": {
    "name": "python",
    "description": "Run Python code in a fresh sandboxed interpreter and return what it prints. "
                   "Nothing is kept between calls; print the values you need.",
    "parameters": {"type": "object", "properties": {"code": {
        "type": "string", "description": "The Python program to run."}}, "required": ["code"]}}}

ToolFn = Callable[[dict[str, Any], float], Any]
"""(arguments by parameter name, timeout_s) -> the output text; may be `async def`."""


@dataclass(frozen=True)
class Tool:
    schema: dict[str, Any]
    """The OpenAI function schema: {"type": "function", "function": {"name", "description", "parameters"}}."""
    fn: ToolFn
    """Runs one call; raises `ToolFailure` (status error) or `ToolTimeout` for what it reports."""
    grace_s: float = 0.0
    """Seconds past timeout_s to wait for a tool that stops itself at timeout_s (the sandbox)."""

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])


def calculator_tool(schema: dict[str, Any] = CALCULATOR_SCHEMA) -> Tool:
    """The calculator under `schema`'s name; its one required string parameter is the expression."""
    param = text_parameter(schema)
    assert param is not None, schema
    return Tool(schema, lambda args, _timeout_s: calculate(args[param]))


def python_tool(sandbox: SandboxConfig, schema: dict[str, Any] = PYTHON_SCHEMA) -> Tool:
    """The code interpreter in `sandbox` (made now, so a missing bwrap fails at start-up)."""
    param = text_parameter(schema)
    assert param is not None, schema
    try:
        box = sandbox_for(sandbox)
    except SandboxError as exc:
        raise ConfigError(str(exc)) from exc
    return Tool(schema, lambda args, timeout_s: run_python(args[param], box, timeout_s), grace_s=SANDBOX_GRACE_S)


def function_tool(fn: Callable[..., Any], schema: dict[str, Any]) -> Tool:
    """A user's function called with the arguments as keywords (`async def` too); its value as text."""
    if inspect.iscoroutinefunction(fn):
        async def call_async(args: dict[str, Any], _timeout_s: float) -> str:
            return _as_text(await fn(**args))
        return Tool(schema, call_async)
    return Tool(schema, lambda args, _timeout_s: _as_text(fn(**args)))


def _as_text(value: Any) -> str:
    return "" if value is None else str(value)


def text_parameter(schema: dict[str, Any]) -> str | None:
    """The tool's single required parameter when it is a string (what a compact call's text fills)."""
    params = schema["function"].get("parameters") or {}
    required = list(params.get("required") or [])
    if len(required) != 1:
        return None
    kind = (params.get("properties") or {}).get(required[0], {}).get("type", "string")
    return str(required[0]) if kind == "string" else None


BUILTINS: dict[str, Callable[[SandboxConfig, dict[str, Any]], Tool]] = {
    "calculator": lambda _sandbox, schema: calculator_tool(schema),
    "python": python_tool,
}
CLASS_NAMES = {
    "calculator": "calculator", "asyncrl.tools.calculator": "calculator",
    "python": "python", "asyncrl.tools.python": "python",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "python",
}
"""class_name -> built-in (verl's code interpreter runs as our python tool, in our sandbox)."""
REFUSED = {"Gsm8kTool": "scores an answer against the row's ground truth, an episode's reward rather than a "
                        "stateless tool: score it in the reward function or a custom episode"}
"""verl classes by class name (any module path) that cannot be mapped, and why."""
DEFAULT_SCHEMAS = {"calculator": CALCULATOR_SCHEMA, "python": PYTHON_SCHEMA}


def load_tools(path: str, sandbox: SandboxConfig) -> list[Tool]:
    """The tools a verl-layout YAML declares (see the module docstring); ConfigError naming KEY if unusable."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise _error(path, f"cannot read it ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise _error(path, f"not valid YAML ({' '.join(str(exc).split())})") from exc
    entries = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise _error(path, "expected a non-empty list under 'tools:' (verl's tool config layout)")
    tools = [_tool(path, k, entry, sandbox) for k, entry in enumerate(entries)]
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _error(path, f"two tools are named {duplicates[0]!r}")
    return tools


def _tool(path: str, k: int, entry: Any, sandbox: SandboxConfig) -> Tool:
    where = f"tools[{k}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise _error(path, f"{where} needs a class_name")
    class_name: str = entry["class_name"]
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise _error(path, f"{where}.config must be a mapping")
    if config.get("type", "native") != "native":
        raise _error(path, f"{where}.config.type={config['type']!r}: only native tools are supported (no mcp, "
                           "benchmax)")
    schema = entry.get("tool_schema")
    builtin = CLASS_NAMES.get(class_name)
    if builtin is not None:
        if set(config) - {"type"}:
            log.warning("%s: %s runs as the built-in %s tool in sandbox.backend=%s; its config keys %s are not "
                        "used", path, class_name, builtin, sandbox.backend, sorted(set(config) - {"type"}))
        schema = _checked_schema(path, where, DEFAULT_SCHEMAS[builtin] if schema is None else schema)
        if text_parameter(schema) is None:
            raise _error(path, f"{where}: the built-in {builtin} tool needs exactly one required string parameter")
        return BUILTINS[builtin](sandbox, schema)
    if ":" in class_name:
        return function_tool(_import(path, where, class_name), _checked_schema(path, where, schema))
    reason = REFUSED.get(class_name.rpartition(".")[2])
    if reason:
        raise _error(path, f"{where}.class_name={class_name!r} {reason}")
    raise _error(path, f"{where}.class_name={class_name!r} is not a tool asyncrl has: use calculator, python, "
                       "verl's SandboxFusionTool, or your own function as 'package.module:function'")


def _checked_schema(path: str, where: str, schema: Any) -> dict[str, Any]:
    if schema is None:
        raise _error(path, f"{where} needs a tool_schema (type: function, function: {{name, description, "
                           "parameters}})")
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(function, dict):
        raise _error(path, f"{where}.tool_schema must be {{type: function, function: {{name, description, "
                           "parameters}}}}")
    name = function.get("name")
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise _error(path, f"{where}.tool_schema.function.name must be a name without spaces, got {name!r}")
    params = function.get("parameters")
    if params is not None and (not isinstance(params, dict) or not isinstance(params.get("properties", {}), dict)
                               or not isinstance(params.get("required", []), list)):
        raise _error(path, f"{where}.tool_schema.function.parameters must be a JSON schema object "
                           "{type: object, properties: {...}, required: [...]}")
    return schema


def _import(path: str, where: str, spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr, None)
    except Exception as exc:  # a user's module can fail to import in any way
        raise _error(path, f"{where}.class_name={spec!r}: cannot import {module_name!r} ({exc})") from exc
    if not callable(fn):
        raise _error(path, f"{where}.class_name={spec!r}: {module_name!r} has no function {attr!r}")
    return fn


def _error(path: str, problem: str) -> ConfigError:
    return ConfigError(f"{KEY}={path!r}: {problem}")
