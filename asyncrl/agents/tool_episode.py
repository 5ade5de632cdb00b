"""The built-in episode: the model calls tools and reads their answers, turn after turn.

    turn 1: model tokens (up to its end-of-turn token) -> parse tool calls -> none: done
            -> run them (registry; timeout, output cut at max_tool_response_length)
            -> ONE tool message with every result, tokenised between the template's delimiters
    turn 2: model tokens ... until no call, a limit, or the response budget.

Limits (`rollout.multi_turn`): calls past `max_tool_calls` for the episode or past
`max_parallel_calls` in one turn become a line saying so in the tool message (`tool_limited`);
a turn with calls once `max_assistant_turns` model turns or `max_user_turns` tool messages were
spent ends the episode as it is (`turn_limited`; verl's agent loop ends right after the last
tool message, unread: here the model answers it first); a tool message that would not leave the
next turn a token of the response budget (`data.max_response_length`, `max_episode_tokens`)
ends it with finish_reason "length". Calls that cannot be parsed become an error line
(`tool_errors`). Counters land in `Trajectory.episode`.

An abort during a tool call does not cut the call: the episode waits for it (bounded by
`tool_timeout_s`), appends its message, and only then stops (the next `generate` returns
"aborted"), so a resumed episode never runs a tool twice. With `keep_slot=keep` the engine
keeps the conversation's KV through the tool calls (`EngineClient.keep`). Each model turn and
tool call is a span in `Trajectory.timings` that trace.json draws on the episode's lane
(`EpisodeBuilder.span`; docs/agents.md, "The trace view"). Not here: the tools
themselves (`asyncrl.tools`), the episode interface (`asyncrl.agents.episode`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from asyncrl.agents.episode import EngineClient, EpisodeBuilder
from asyncrl.agents.messages import MessageTemplate
from asyncrl.config.names import ToolCallFormat
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.telemetry import clock
from asyncrl.types import PromptRow, Trajectory

SPAN_NAME_CHARS = 64
"""Characters of a tool's name kept in its trace span's name ("tool:<name>")."""


class ToolCallLike(Protocol):
    @property
    def name(self) -> str: ...


class ToolResultLike(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def truncated(self) -> bool: ...


class Tools(Protocol):
    """What the episode needs of a tool registry (`asyncrl.tools.ToolRegistry`)."""

    async def run(self, call: Any, *, timeout_s: float, max_chars: int) -> ToolResultLike:
        """Never raises: a failing, hanging or unknown tool is a result with a status."""
        ...


ParseCalls = Callable[[str, ToolCallFormat], "tuple[Sequence[Any], Sequence[str]]"]
"""`asyncrl.tools.parse_tool_calls`: (calls, one message per block that could not be read)."""


class ToolEpisode:
    """The built-in tool-calling episode (`Episode`); one instance serves every episode of a run."""

    def __init__(self, cfg: MultiTurnConfig, tools: Tools, parse: ParseCalls, message: MessageTemplate) -> None:
        self.cfg = cfg
        self.tools = tools
        self.parse = parse
        self.message = message

    async def __call__(self, row: PromptRow, client: EngineClient, partial: Trajectory | None) -> Trajectory:
        ep = EpisodeBuilder.resume(client.prompt_ids, partial)
        budget = client.max_response_tokens
        while True:
            prefix = ep.open_turn()
            room = budget - len(ep.response_ids)
            if room < 1:
                return ep.trajectory(client.episode_id, "length")
            start = clock.now()
            turn = await client.generate([*client.prompt_ids, *ep.response_ids], max_tokens=room, prefix=prefix)
            if prefix is None and turn.response_ids:  # a turn is counted once, when it has a token
                ep.count("num_turns")
            new = len(turn.response_ids) - (len(prefix.response_ids) if prefix is not None else 0)
            ep.span("turn", start, clock.now(), turn=ep.get("num_turns"), tokens=new, finish=turn.finish_reason)
            ep.add_model(turn)
            if turn.finish_reason != "stop":  # aborted (kept as an open turn) or out of budget
                return ep.trajectory(client.episode_id, turn.finish_reason)
            text = client.tokenizer.decode(list(turn.response_ids), skip_special_tokens=False)
            calls, errors = self.parse(text, self.cfg.format)
            if not calls and not errors:
                return ep.trajectory(client.episode_id, "stop")
            if ep.get("num_turns") >= self.cfg.max_assistant_turns or ep.get("user_turns") >= self.cfg.max_user_turns:
                ep.count("turn_limited")
                return ep.trajectory(client.episode_id, "stop")
            context = [*client.prompt_ids, *ep.response_ids]
            kept = client.keep(context, self.cfg.tool_timeout_s + 1.0)  # the slot waits out the tools
            ids = self.message.encode(await self._answers(calls, errors, ep))
            if len(ep.response_ids) + len(ids) >= budget:
                if kept:
                    client.release(context)
                return ep.trajectory(client.episode_id, "length")
            ep.add_environment(ids)
            ep.count("user_turns")

    async def _answers(self, calls: Sequence[Any], errors: Sequence[str], ep: EpisodeBuilder) -> str:
        """One tool message: each call's answer (past max_tool_calls: a line saying so), then
        each parse error. Calls of one turn run at once."""
        allowed = max(int(self.cfg.max_tool_calls - ep.get("tool_calls")), 0)
        if self.cfg.max_parallel_calls:
            allowed = min(allowed, self.cfg.max_parallel_calls)
        run, refused = calls[:allowed], calls[allowed:]
        start = clock.now()
        ended = await asyncio.gather(*(self._timed(c) for c in run))
        results = [r for r, _ in ended]
        for c, (r, end) in zip(run, ended):  # spans from one start: concurrent calls nest in the trace
            name = c.name[:SPAN_NAME_CHARS]  # an unknown tool's name is whatever the model wrote
            ep.span(f"tool:{name}", start, end, status=r.status, seconds=r.seconds, turn=ep.get("num_turns"))
        for r in results:
            ep.count("tool_calls")
            ep.count("tool_time_s", r.seconds)
            ep.count("tool_errors", r.status != "ok")
            ep.count("tool_truncated", r.truncated)
        ep.count("tool_limited", len(refused))
        ep.count("tool_errors", len(errors))
        lines = [r.text for r in results]
        lines += [f"error: {c.name}: not run, past the tool call limit (max_tool_calls={self.cfg.max_tool_calls} "
                  f"per episode, max_parallel_calls={self.cfg.max_parallel_calls} per turn)" for c in refused]
        lines += [f"error: {e}" for e in errors]
        return "\n".join(lines)

    async def _timed(self, call: Any) -> tuple[ToolResultLike, float]:
        """A call's result and the clock when it came back."""
        result = await self.tools.run(call, timeout_s=self.cfg.tool_timeout_s,
                                      max_chars=self.cfg.max_tool_response_length)
        return result, clock.now()
