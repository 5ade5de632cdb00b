"""Bring your own agent: an agent written for the OpenAI API, run as a rollout episode.

    async def agent(row: dict, client: openai.AsyncOpenAI) -> float | dict[str, float] | None
    async def agent(row: dict, base_url: str) -> ...           # builds its own client / subprocess

`rollout.agent.entrypoint` names it. Each episode opens a session on the host's `Gateway` (an
unguessable URL), runs the agent with a client bound to it, and closes the session when the
agent returns. An episode is one trajectory per chain (AReaL's rule), all with the episode's
reward: the trajectory it returns is its LAST chain (the conversation its final call continued:
for an agent that extends its messages, the only one), and the others ride along in its
`chains`, each trained as a sequence of its own (`asyncrl.training.batch.build_batch`) while
the group, the ledger and staleness count the episode once (`agent/chains` counts them). The
reward is what the agent returns (a dict: the sum of its terms, kept as details), or with None
the run's reward function scores the last chain's text.

An agent's Python state cannot be checkpointed: an episode stopped midway (a stop, tail
batching) comes back "aborted" and is restarted from its row when continued (`agent/restarts`).
An agent that raises, runs past `rollout.agent.timeout_s` or never calls the model is a
failed episode: reward 0, status agent_error | agent_timeout | agent_no_calls, one log line,
counted; more than `reward.max_failure_ratio` of the last step's episodes failed stops the run.
Not here: the calls themselves (`session`, `chains`), HTTP (`server`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from typing import Any

from asyncrl.agents.episode import EngineClient
from asyncrl.agents.gateway.client import in_process_client
from asyncrl.agents.gateway.server import Gateway
from asyncrl.agents.gateway.session import AgentSession
from asyncrl.config.schema import AgentConfig, MultiTurnConfig
from asyncrl.errors import ConfigError, RolloutError
from asyncrl.types import PromptRow, Trajectory
from asyncrl.user_code import import_function

log = logging.getLogger(__name__)
KEY = "rollout.agent.entrypoint"
AGENT_STATUS = "agent"
"""`Trajectory.reward_status` of a reward the agent gave (the reward function does not score it)."""


class AgentEpisode:
    """The `Episode` of `rollout.agent.entrypoint`; one instance per rollout host."""

    def __init__(self, cfg: AgentConfig, mt: MultiTurnConfig, *, max_prompt_tokens: int,
                 template_kwargs: dict[str, Any], max_failure_ratio: float, window: int) -> None:
        self.cfg, self.mt = cfg, mt
        self.fn, self.wants_url = load_agent(cfg.entrypoint)
        self.max_prompt_tokens = max_prompt_tokens
        self.template_kwargs = template_kwargs
        self.gateway = Gateway(cfg.max_request_bytes)
        self.max_failure_ratio = max_failure_ratio
        self.outcomes: deque[bool] = deque(maxlen=window)
        """The last episodes: True for a failure."""

    async def __call__(self, row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory:
        session = AgentSession(client, fmt=self.mt.format, max_turns=self.mt.max_assistant_turns,
                               max_concurrent=self.cfg.max_concurrent_calls, max_prompt_tokens=self.max_prompt_tokens,
                               template_kwargs=self.template_kwargs)
        token = self.gateway.open(session)
        status, result = "ok", None
        try:
            result = await asyncio.wait_for(self._run(row, token), self.cfg.timeout_s)
        except TimeoutError:
            status = "agent_timeout"
        except Exception as exc:  # the agent's code can fail in any way: a failed episode, never a crash
            status = "ok" if session.limited or client.stopped() else "agent_error"
            if status != "ok":
                log.warning("agent: episode %s raised %s: %s (counted in agent/errors)", client.episode_id,
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        finally:
            self.gateway.close(token)
        if status == "ok" and session.last is None and not client.stopped():
            status = "agent_no_calls"
        traj = await self._trajectory(session, client, row, status)
        traj.episode |= {"agent/restarts": float(partial is not None), "agent/errors": float(status == "agent_error"),
                         "agent/timeouts": float(status == "agent_timeout"),
                         "agent/no_calls": float(status == "agent_no_calls"),
                         "agent/late_calls": float(self._late_calls())}
        if traj.finish_reason != "aborted":
            self._judge(status != "ok", status)
            _set_reward(traj, result, status)
        return traj

    async def _run(self, row: PromptRow, token: str) -> Any:
        if self.wants_url:
            await self.gateway.serve(self.cfg.host)
            return await self.fn(row_dict(row), self.gateway.base_url(self.cfg.host, token))
        api = in_process_client(self.gateway, token)
        try:
            return await self.fn(row_dict(row), api)
        finally:
            await api.close()

    async def _trajectory(self, session: AgentSession, client: EngineClient, row: PromptRow, status: str) -> Trajectory:
        """The last chain (aborted when the run stopped the episode), the other chains in its
        `chains` (none when aborted: the episode restarts from its row); an episode without a call
        gets one sampled token after its row's prompt, as context (mask 0), so it has a version."""
        chain = session.last
        if chain is not None:
            reason = "aborted" if client.stopped() else chain.finish_reason
            traj = chain.builder.trajectory(client.episode_id, reason)
        elif client.stopped():
            traj = Trajectory(client.episode_id, row.prompt_ids, [], [], [], "aborted")
        else:
            turn = await client.generate(row.prompt_ids, max_tokens=1)
            traj = Trajectory(client.episode_id, row.prompt_ids, list(turn.response_ids), list(turn.logprobs),
                              list(turn.versions), "aborted" if turn.finish_reason == "aborted" else "stop",
                              loss_mask=[0] * len(turn.response_ids))
        traj.episode = dict(session.trajectory_counters())
        if chain is not None and traj.finish_reason != "aborted":
            traj.chains = [c.builder.trajectory(f"{client.episode_id}/chain{c.index}", c.finish_reason)
                           for c in session.book.chains if c is not chain and c.calls]
        return traj

    def _late_calls(self) -> int:
        late, self.gateway.late_calls = self.gateway.late_calls, 0
        return late

    def _judge(self, failed: bool, status: str) -> None:
        self.outcomes.append(failed)
        bad = sum(self.outcomes)
        if len(self.outcomes) == self.outcomes.maxlen and bad > self.max_failure_ratio * len(self.outcomes):
            raise RolloutError(f"agent: {bad} of the last {len(self.outcomes)} episodes failed (last: {status}), more "
                               f"than reward.max_failure_ratio={self.max_failure_ratio:g}; fix the agent "
                               f"({KEY}) or raise rollout.agent.timeout_s")


def _set_reward(traj: Trajectory, result: Any, status: str) -> None:
    if status != "ok":
        traj.reward, traj.reward_status = 0.0, status
    elif isinstance(result, dict):
        traj.reward_details = {str(k): float(v) for k, v in result.items()}
        traj.reward, traj.reward_status = sum(traj.reward_details.values()), AGENT_STATUS
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        traj.reward, traj.reward_status = float(result), AGENT_STATUS


def row_dict(row: PromptRow) -> dict[str, Any]:
    """The row in verl's layout, as the agent reads it."""
    prompt: Any = row.text if row.text else [dict(m) for m in row.messages]
    return {"prompt": prompt, "data_source": row.data_source, "ability": row.ability,
            "reward_model": {"style": "rule", "ground_truth": row.ground_truth},
            "extra_info": dict(row.extra_info), "uid": row.uid}


def load_agent(spec: str) -> tuple[Any, bool]:
    """Import `"module:function"` or `"file.py:function"`: (the function, whether it takes base_url)."""
    fn, _, name = import_function(spec, KEY, "asyncrl_agent_")
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{KEY}={spec!r}: {name!r} must be an async function (row, client) or (row, base_url)")
    params = list(inspect.signature(fn).parameters)
    if len(params) != 2 or params[1] not in ("client", "base_url"):
        raise ConfigError(f"{KEY}={spec!r}: {name!r} must take (row, client) or (row, base_url), "
                          f"got ({', '.join(params)})")
    return fn, params[1] == "base_url"
