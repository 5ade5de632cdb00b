"""Sessions over scripted models for the gateway tests (tiny-tools' tokenizer and template)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.agents.episode import EngineClient, TurnRunner
from asyncrl.agents.gateway import AgentSession
from asyncrl.models.tool_traces import build_tool_tokenizer
from asyncrl.types import GenerationRequest, SamplingParams, Trajectory
from tests.agents.fakes import ScriptedModel

TOOL_TOK = build_tool_tokenizer()
QUESTION = {"role": "user", "content": "What is 12+30?"}
CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def two_turns(k: int) -> str:
    """Turn 0 calls the calculator; every later turn answers."""
    return "<tool_call>calculator 12+30</tool_call>" if k == 0 else "Answer: 42"


def session(run: TurnRunner | None = None, *, tok: Any = TOOL_TOK, max_turns: int = 5, max_concurrent: int = 4,
            budget: int = 96, stopped: Callable[[], bool] = lambda: False, eid: str = "ep0") -> AgentSession:
    run = run or ScriptedModel(two_turns, tok=tok)
    client = EngineClient(GenerationRequest(eid, (1,), SamplingParams(max_tokens=budget)), run, tok,
                          max_response_tokens=budget, stopped=stopped)
    return AgentSession(client, fmt="compact", max_turns=max_turns, max_concurrent=max_concurrent,
                        max_prompt_tokens=200, template_kwargs={})


class CharModel:
    """A TurnRunner that samples `script(k)` one CHARACTER token at a time (k = tool messages in
    the context), then EOS: its ids decode to text that re-encodes to other ids (the `<tool_call>`
    tags are single added tokens when the text is encoded)."""

    def __init__(self, script: Callable[[int], str], tok: Any = TOOL_TOK) -> None:
        self.script, self.tok = script, tok
        self.sampled: list[list[int]] = []

    async def __call__(self, request: GenerationRequest) -> Trajectory:
        k = self.tok.decode(list(request.prompt_ids)).count("<|tool|>")
        ids = [self.tok.convert_tokens_to_ids(c) for c in self.script(k)] + [self.tok.eos_token_id]
        self.sampled.append(ids)
        return Trajectory(request.request_id, request.prompt_ids, ids, [-0.5] * len(ids), [3] * len(ids), "stop")
