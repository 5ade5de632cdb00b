"""One agent episode's side of the endpoint: its calls turned into engine turns on its chains.

`AgentSession.complete(request)` plans the call on a chain (`chains`), sends one model turn
through the episode's `EngineClient` (the rollout server's path: pause, partial rollout, abort
and versions apply as to any episode turn), parses the tool calls out of the text by the run's
call format, records the turn on its chain and returns the OpenAI answer. The run's sampling
parameters apply (the trained log-probs are those of the run's temperature); a request's
temperature, top_p and stop are accepted and not applied (docs/agents.md).
Not here: HTTP (`server`), the agent's lifetime and reward (`asyncrl.agents.gateway.episode`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.agents.episode import EngineClient
from asyncrl.agents.gateway.chains import Chain, ChainBook
from asyncrl.agents.gateway.chat import ApiError, ChatRequest, Completion, Message, ToolCallOut
from asyncrl.config.names import ToolCallFormat
from asyncrl.tools.calls import RAW_ARGUMENT, parse_tool_calls

ParseCalls = Callable[[str, ToolCallFormat], "tuple[Sequence[Any], Sequence[str]]"]


class AgentSession:
    """The calls of one episode: its chains, counters and limits."""

    def __init__(self, client: EngineClient, *, fmt: ToolCallFormat, max_turns: int, max_concurrent: int,
                 max_prompt_tokens: int, template_kwargs: dict[str, Any],
                 parse: ParseCalls = parse_tool_calls) -> None:
        self.client = client
        self.fmt = fmt
        self.max_turns = max_turns
        self.max_concurrent = max_concurrent
        self.parse = parse
        self.book = ChainBook(client.tokenizer, template_kwargs, max_prompt_tokens)
        self.in_flight = 0
        self.ended = False
        self.limited = False
        """A call was refused by a turn limit or the token budget: the agent's error that follows is no failure."""
        self.last: Chain | None = None
        self.counters: dict[str, float] = {}

    async def complete(self, req: ChatRequest) -> Completion:
        if self.ended:
            raise ApiError(404, "this episode has ended; its URL is no longer valid", code="episode_ended")
        if self.client.stopped():
            raise ApiError(409, "this episode was stopped by the run (a stop or an abort)", code="episode_stopped")
        if self.in_flight >= self.max_concurrent:
            raise ApiError(429, f"more than rollout.agent.max_concurrent_calls={self.max_concurrent} calls of this "
                           "episode in flight", code="too_many_calls")
        if self.calls >= self.max_turns:
            self.limited = True
            raise ApiError(400, f"the episode made rollout.multi_turn.max_assistant_turns={self.max_turns} calls",
                           code="turn_limit_reached")
        self.in_flight += 1
        try:
            return await self._complete(req)
        finally:
            self.in_flight -= 1

    @property
    def calls(self) -> int:
        return int(self.counters.get("calls", 0))

    async def _complete(self, req: ChatRequest) -> Completion:
        plan = self.book.plan(req, json.dumps(req.tools, sort_keys=True))
        chain, ep = plan.chain, plan.chain.builder
        room = self.client.max_response_tokens - (len(plan.context_ids) - len(ep.prompt_ids))
        if room < 1:
            self.limited = True
            raise ApiError(400, f"the conversation has no room left in the episode's "
                           f"{self.client.max_response_tokens} response tokens (data.max_response_length)",
                           code="context_length_exceeded", param="messages")
        if req.max_tokens is not None and req.max_tokens > self.client.max_response_tokens:
            raise ApiError(400, f"max_tokens={req.max_tokens} is more than the run's "
                           f"{self.client.max_response_tokens} (data.max_response_length)", param="max_tokens")
        chain.busy = True
        try:
            turn = await self.client.generate(plan.context_ids, max_tokens=min(room, req.max_tokens or room))
        finally:
            chain.busy = False
        if turn.finish_reason == "aborted":
            raise ApiError(409, "this episode was stopped by the run during the call", code="episode_stopped")
        message, raw = self._message(turn.response_ids, req)
        self.book.record(plan, turn, message, raw, req)
        self.last = chain
        self._count("calls")
        self._count("tool_calls", len(message.tool_calls))
        self._count("completion_tokens", len(turn.response_ids))
        finish = "tool_calls" if message.tool_calls else "length" if turn.finish_reason == "length" else "stop"
        return Completion(f"chatcmpl-{self.client.episode_id}-{self.calls}", message, finish,
                          len(plan.context_ids), len(turn.response_ids), len(plan.context_ids) - plan.new_ids,
                          tuple(turn.response_ids), tuple(plan.context_ids), tuple(turn.logprobs))

    def _message(self, ids: Sequence[int], req: ChatRequest) -> tuple[Message, str]:
        """The assistant message of a turn (tool-call blocks out of its text, as tool_calls) and
        the turn's raw text (end-of-turn token off) for the chain's template check."""
        tok = self.client.tokenizer
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        body = list(ids)
        while body and body[-1] in eos:
            body.pop()
        raw = tok.decode(body, skip_special_tokens=False)
        text = tok.decode(body, skip_special_tokens=True)
        calls, _ = self.parse(text, self.fmt)
        for c in calls:
            text = text.replace(c.text, "")
        out = tuple(ToolCallOut(f"call_{self.calls}_{i}", c.name, json.dumps(_arguments(c, req.tools)))
                    for i, c in enumerate(calls))
        return Message("assistant", text.strip() if out else text, out), raw

    def trajectory_counters(self) -> dict[str, float]:
        """The episode's counters as `Trajectory.episode` holds them (`agent/...` summed per step)."""
        book = self.book.counters
        return {"num_turns": self.counters.get("calls", 0.0), "tool_calls": self.counters.get("tool_calls", 0.0),
                "agent/calls": self.counters.get("calls", 0.0), "agent/chains": book.get("chains", 0.0),
                "agent/retokenized_tokens": book.get("retokenized_tokens", 0.0),
                "agent/template_rewrites": book.get("template_rewrites", 0.0)}

    def _count(self, name: str, by: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + by


def _arguments(call: Any, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A call's arguments by name: a compact call's one unnamed argument goes to the tool's one
    required parameter, as the request's `tools` declare it (else "input")."""
    args = dict(call.arguments)
    if RAW_ARGUMENT not in args:
        return args
    raw = args.pop(RAW_ARGUMENT)
    for t in tools:
        fn = t.get("function", t)
        if fn.get("name") == call.name:
            required = (fn.get("parameters") or {}).get("required") or list((fn.get("parameters") or {})
                                                                            .get("properties", {}))
            if len(required) == 1:
                return args | {required[0]: raw}
    return args | {"input": raw}
