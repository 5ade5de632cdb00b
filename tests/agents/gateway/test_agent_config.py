"""`rollout.agent.entrypoint` turns agent episodes on, is refused beside a custom episode, and
names a function of (row, client) or (row, base_url)."""

from __future__ import annotations

import pytest

from asyncrl.agents.gateway.episode import load_agent
from asyncrl.config import load_config
from asyncrl.errors import ConfigError

EXAMPLE = "examples/openai_agents_calculator.py:agent"


def test_the_entrypoint_alone_turns_multi_turn_on():
    cfg = load_config(overrides=[f"rollout.agent.entrypoint={EXAMPLE}"])
    assert cfg.rollout.multi_turn.enable and cfg.rollout.agent.timeout_s == 300.0


def test_entrypoint_and_custom_episode_together_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="rollout.agent.entrypoint.*rollout.multi_turn.episode") as err:
        load_config(overrides=[f"rollout.agent.entrypoint={EXAMPLE}", "rollout.multi_turn.episode=a.b:c"])
    assert "\n" not in str(err.value)


def test_the_agent_function_is_checked(tmp_path):
    fn, wants_url = load_agent(EXAMPLE)
    assert fn.__name__ == "agent" and not wants_url
    bad = tmp_path / "bad_agent.py"
    bad.write_text("async def agent(row, llm):\n    return 1.0\n\ndef sync(row, client):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"\(row, client\) or \(row, base_url\)"):
        load_agent(f"{bad}:agent")
    with pytest.raises(ConfigError, match="async function"):
        load_agent(f"{bad}:sync")
    with pytest.raises(ConfigError, match="rollout.agent.entrypoint"):
        load_agent("no_colon")
