"""Named fakes for episode tests: a scripted model behind a TurnRunner, tools, a call parser."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.agents import MessageTemplate, ToolEpisode
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.types import EngineStats, FinishReason, GenerationRequest, Trajectory

TOK = build_char_tokenizer()
EOS = TOK.eos_token  # "<|end|>"


@dataclass(frozen=True)
class FakeCall:
    name: str
    arguments: dict[str, Any]
    text: str


@dataclass(frozen=True)
class FakeResult:
    text: str
    status: str
    seconds: float
    truncated: bool = False


def compact_calls(text: str, fmt: str) -> tuple[list[FakeCall], list[str]]:
    """`<tool_call>NAME ARG</tool_call>` blocks; an empty block is a parse error."""
    calls, errors = [], []
    for m in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
        name, _, arg = m.group(1).strip().partition(" ")
        if name:
            calls.append(FakeCall(name, {"expression": arg}, m.group(0)))
        else:
            errors.append("empty call")
    return calls, errors


class AddTools:
    """`add A+B` answers the sum after `delay_s`; `boom` fails; every call is recorded."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[FakeCall] = []
        self.max_chars: list[int] = []

    async def run(self, call: FakeCall, *, timeout_s: float, max_chars: int) -> FakeResult:
        self.calls.append(call)
        self.max_chars.append(max_chars)
        await asyncio.sleep(self.delay_s)
        if call.name != "add":
            return FakeResult(f"unknown tool {call.name}", "unknown_tool", self.delay_s)
        a, b = call.arguments["expression"].split("+")
        text = str(int(a) + int(b))
        return FakeResult(text[:max_chars], "ok", self.delay_s, len(text) > max_chars)


class ScriptedModel:
    """A TurnRunner whose turn k (k = `marker`s, tool messages, in the context) is `script(k)` + EOS.

    Token t of a turn has log-prob -(t + 1) / 100 and the model's current `version`. `cut`
    maps a call number to how many new tokens it yields before returning "aborted" (an abort
    in that turn). Requests are recorded."""

    def __init__(self, script: Callable[[int], str], version: int = 0, cut: dict[int, int] | None = None,
                 tok: Any = TOK, marker: str = "<|tool|>") -> None:
        self.script = script
        self.tok = tok
        self.marker = marker
        self.version = version
        self.cut = cut or {}
        self.requests: list[GenerationRequest] = []

    async def __call__(self, request: GenerationRequest) -> Trajectory:
        call = len(self.requests)
        self.requests.append(request)
        k = self.tok.decode(list(request.prompt_ids)).count(self.marker)
        full = self.tok.encode(self.script(k) + self.tok.eos_token, add_special_tokens=False)
        ids = list(request.prefix_ids)
        assert full[: len(ids)] == ids, "a continued turn starts with its prefix"
        logprobs, versions = list(request.prefix_logprobs), list(request.prefix_versions)
        limit = min(len(full), request.params.max_tokens)
        stop_at = len(ids) + self.cut[call] if call in self.cut else None
        while len(ids) < limit:
            if stop_at is not None and len(ids) >= stop_at:
                return Trajectory(request.request_id, request.prompt_ids, ids, logprobs, versions, "aborted")
            logprobs.append(-(len(ids) + 1) / 100)
            ids.append(full[len(ids)])
            versions.append(self.version)
        reason: FinishReason = "stop" if ids and ids[-1] == self.tok.eos_token_id else "length"
        return Trajectory(request.request_id, request.prompt_ids, ids, logprobs, versions, reason)


STEP_S = 0.002


class StepEngine:
    """An `Engine` over a `ScriptedModel`'s script: one token every STEP_S; `abort` and
    `pause("abort")` resolve a request with its tokens so far; tokens after `load_weights(.., v)`
    carry version v."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.version = 0
        self._cut: dict[str, asyncio.Event] = {}
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.generated = 0

    async def generate(self, request: GenerationRequest) -> Trajectory:
        tok, model = self.model.tok, self.model
        model.requests.append(request)
        k = tok.decode(list(request.prompt_ids)).count(model.marker)
        full = tok.encode(model.script(k) + tok.eos_token, add_special_tokens=False)
        ids, logprobs, versions = list(request.prefix_ids), list(request.prefix_logprobs), list(request.prefix_versions)
        cut = self._cut[request.request_id] = asyncio.Event()
        try:
            while len(ids) < min(len(full), request.params.max_tokens):
                await asyncio.sleep(STEP_S)
                if not cut.is_set():
                    await self._resumed.wait()  # paused ("keep"): frozen at a step boundary
                if cut.is_set():
                    return Trajectory(request.request_id, request.prompt_ids, ids, logprobs, versions, "aborted")
                logprobs.append(-(len(ids) + 1) / 100)
                ids.append(full[len(ids)])
                versions.append(self.version)
                self.generated += 1
        finally:
            self._cut.pop(request.request_id, None)
        reason: FinishReason = "stop" if ids[-1] == tok.eos_token_id else "length"
        return Trajectory(request.request_id, request.prompt_ids, ids, logprobs, versions, reason)

    async def abort(self, request_ids) -> list[Trajectory]:
        for rid in request_ids:
            if rid in self._cut:
                self._cut[rid].set()
        return []

    async def abort_all(self) -> list[Trajectory]:
        return await self.abort(list(self._cut))

    async def pause(self, mode: str = "keep") -> list[Trajectory]:
        self._resumed.clear()
        return await self.abort_all() if mode == "abort" else []

    async def resume(self) -> None:
        self._resumed.set()

    async def load_weights(self, named_tensors, version: int) -> None:
        self.version = version

    def weights_checksum(self) -> str:
        return ""

    def stats(self) -> EngineStats:
        return EngineStats(len(self._cut), 0, 0, 0, 1, self.generated, 0.0, self.version)


def always_add(text: str, fmt: str) -> tuple[list[FakeCall], list[str]]:
    """A parser that reads every turn as one call of `add 2+3` (the tiny model writes no calls)."""
    return [FakeCall("add", {"expression": "2+3"}, text)], []


PIPELINE_EPISODE = ToolEpisode(MultiTurnConfig(enable=True, max_assistant_turns=2), AddTools(delay_s=0.005),
                               always_add, MessageTemplate(TOK))
"""`rollout.multi_turn.episode=tests.agents.fakes:PIPELINE_EPISODE`: two model turns around one
tool message (the tiny model and tokenizer), for runs of the real pipelines."""
SLOW_TOOL_EPISODE = ToolEpisode(MultiTurnConfig(enable=True, max_assistant_turns=2), AddTools(delay_s=0.2),
                                always_add, MessageTemplate(TOK))
"""PIPELINE_EPISODE's twin with slower tools, which a test may swap (`.tools`) for tools that stop the run."""
