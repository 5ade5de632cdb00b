"""The episode a run's rollout servers play, from `rollout.multi_turn`.

`prompt_data` puts the built-in tool episode's tool schemas into the prompts' chat template.
`episode_from_config` returns None when multi_turn is off (the server's single-turn path), the
function named by `rollout.multi_turn.episode` ("module:function" or "path/file.py:function"),
or the built-in tool episode over the registry of `rollout.multi_turn.tool_config_path`.
A name that does not resolve is a ConfigError naming the key, raised when the server is built.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, cast

from asyncrl.agents.episode import Episode
from asyncrl.agents.messages import MessageTemplate
from asyncrl.agents.tool_episode import ToolEpisode
from asyncrl.config.long_tail import SandboxConfig
from asyncrl.config.schema import DataConfig, MultiTurnConfig
from asyncrl.data.tokenization import template_kwargs
from asyncrl.errors import ConfigError
from asyncrl.user_code import import_function

KEY = "rollout.multi_turn.episode"


def episode_from_config(mt: MultiTurnConfig, tokenizer: Any, *, sandbox: SandboxConfig,
                        template_kwargs: dict[str, Any] | None = None) -> Episode | None:
    if not mt.enable:
        return None
    if mt.episode:
        return load_episode(mt.episode)
    from asyncrl.tools import ToolRegistry, parse_tool_calls  # the tools load only for tool episodes

    tools = ToolRegistry.from_config(mt.tool_config_path, sandbox=sandbox)
    return ToolEpisode(mt, tools, parse_tool_calls, MessageTemplate(tokenizer, "tool", template_kwargs))


def prompt_data(data: DataConfig, mt: MultiTurnConfig, sandbox: SandboxConfig, agent: str = "") -> DataConfig:
    """`data` whose prompts list the built-in tool episode's tools: their schemas go to the chat
    template as `tools` (a `data.chat_template_kwargs` entry), as verl's tool agent loop templates
    its prompts; unchanged for single turn, custom episodes and agents (`agent`:
    rollout.agent.entrypoint; they template their own)."""
    if not mt.enable or mt.episode or agent:
        return data
    from asyncrl.tools import ToolRegistry

    schemas = ToolRegistry.from_config(mt.tool_config_path, sandbox=sandbox).schemas()
    return dataclasses.replace(data, chat_template_kwargs=(*data.chat_template_kwargs, f"tools={json.dumps(schemas)}"))


def load_episode(spec: str) -> Episode:
    """Import `"module:function"` or `"path/to/file.py:function"`: an async function
    `(row, client, partial) -> Trajectory`."""
    fn, where, name = import_function(spec, KEY, "asyncrl_custom_episode_")
    if fn is None:
        raise ConfigError(f"{KEY}={spec!r}: {where!r} has no attribute {name!r}")
    target = fn.__call__ if not inspect.isfunction(fn) and callable(fn) else fn
    if not inspect.iscoroutinefunction(target):
        raise ConfigError(f"{KEY}={spec!r}: {name!r} must be an async function (row, client, partial) -> Trajectory")
    return cast(Episode, fn)


def message_template_kwargs(data: DataConfig) -> dict[str, Any]:
    """What the prompts were templated with (`data.chat_template`, `data.chat_template_kwargs`),
    so tool messages are rendered by the same template."""
    kwargs: dict[str, Any] = template_kwargs(data.chat_template_kwargs)
    if data.chat_template:
        kwargs["chat_template"] = data.chat_template
    return kwargs
