"""Bring your own agent: an OpenAI-compatible endpoint per episode into the rollout engines.

`AgentEpisode` (the episode of `rollout.agent.entrypoint`), `Gateway` (the HTTP app),
`AgentSession` (one episode's calls), `ChainBook` (token-exact chains). See docs/agents.md.
Imports starlette and openai: loaded only when `rollout.agent.entrypoint` is set.
"""

from asyncrl.agents.gateway.chains import ChainBook
from asyncrl.agents.gateway.episode import AGENT_STATUS, AgentEpisode
from asyncrl.agents.gateway.server import Gateway
from asyncrl.agents.gateway.session import AgentSession

__all__ = ["AGENT_STATUS", "AgentEpisode", "AgentSession", "ChainBook", "Gateway"]
