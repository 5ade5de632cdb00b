"""OpenAI chat-completions objects: a request read and checked, the response and stream chunks
built, errors in OpenAI's shape. Pure: no server, no engine.

A request's `messages` are normalised (`Message`) so that a message an agent sends back
compares equal to the one this endpoint returned, whatever the client library did to it
(content None or "", a list of text parts, arguments re-serialised): that equality is what
decides whether a call continues a chain (`asyncrl.agents.gateway.chains`).
Not here: HTTP (`server`), tokens and chains (`chains`, `session`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MODEL_NAME = "policy"
"""What GET /v1/models lists; any `model` a request names means the policy being trained."""


class ApiError(Exception):
    """An OpenAI-style error: the HTTP status, a message, its type and code."""

    def __init__(self, status: int, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        kind = {404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
                429: "rate_limit_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""

    def key(self) -> tuple[str, str, str]:
        return self.id, self.name, _canonical_json(self.arguments)


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCallOut, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    def key(self) -> tuple[Any, ...]:
        """What two messages must share to be the same message."""
        return self.role, self.content, tuple(c.key() for c in self.tool_calls), self.tool_call_id

    def for_template(self, content: str | None = None) -> dict[str, Any]:
        """The message as a chat template reads it (`content` replaces the text)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content if content is None else content}
        if self.tool_calls and content is None:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": json.loads(c.arguments) if _is_json(c.arguments) else c.arguments}}
                for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    stop: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def parse_request(body: Any) -> ChatRequest:
    """A chat-completions body checked: 422 for a wrong shape, 400 for what is not supported."""
    if not isinstance(body, dict):
        raise ApiError(422, "the request body must be a JSON object")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(422, "'messages' must be a non-empty list", param="messages")
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "only n=1 is supported: an episode is one conversation", param="n")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError(422, "'tools' must be a list of objects", param="tools")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ApiError(422, "'max_tokens' must be a positive integer", param="max_tokens")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    options = body.get("stream_options") or {}
    return ChatRequest(tuple(_message(m, i) for i, m in enumerate(raw)), tuple(tools), max_tokens,
                       bool(body.get("stream")), bool(options.get("include_usage")), bool(body.get("logprobs")),
                       tuple(str(s) for s in stop))


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict) or raw.get("role") not in ROLES:
        raise ApiError(422, f"{where} must be an object with a role in {', '.join(ROLES)}", param=where)
    calls = tuple(_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(raw.get("tool_calls") or []))
    role = "system" if raw["role"] == "developer" else raw["role"]
    return Message(role, _text(raw.get("content"), where), calls, str(raw.get("tool_call_id") or ""),
                   str(raw.get("name") or "") if role == "tool" else "")


def _text(content: Any, where: str) -> str:
    """A message's text: a string, None (""), or a list of text parts joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"{where}.content: only text content is supported", param=f"{where}.content")


def _tool_call(raw: Any, where: str) -> ToolCallOut:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(422, f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                       param=where)
    args = fn.get("arguments", "")
    return ToolCallOut(str(raw.get("id", "")), fn["name"], args if isinstance(args, str) else json.dumps(args))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _canonical_json(text: str) -> str:
    """Arguments compared by value: a client may re-serialise them with other spacing."""
    return json.dumps(json.loads(text), sort_keys=True) if _is_json(text) else text


@dataclass(frozen=True)
class Completion:
    """One call's answer: the assistant message, the finish reason and the token counts."""

    id: str
    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def message_dict(self) -> dict[str, Any]:
        m = self.message
        out: dict[str, Any] = {"role": "assistant", "content": m.content or (None if m.tool_calls else "")}
        if m.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
        return out

    def body(self, with_logprobs: bool) -> dict[str, Any]:
        """The chat.completion object; `prompt_token_ids`/`token_ids` as vLLM names them."""
        choice: dict[str, Any] = {"index": 0, "message": self.message_dict(), "finish_reason": self.finish_reason,
                                  "logprobs": self._logprobs() if with_logprobs else None,
                                  "token_ids": list(self.token_ids)}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": MODEL_NAME,
                "choices": [choice], "usage": self.usage(), "prompt_token_ids": list(self.prompt_token_ids)}

    def _logprobs(self) -> dict[str, Any]:
        return {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                            for t, lp in zip(self.token_ids, self.logprobs)]}

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The chat.completion.chunk objects of a streamed answer: role, content, tool calls,
        finish reason (and usage when asked)."""
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": MODEL_NAME}
        m = self.message
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if m.content:
            deltas.append({"content": m.content})
        if m.tool_calls:
            deltas.append({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                           "function": {"name": c.name, "arguments": c.arguments}}
                                          for i, c in enumerate(m.tool_calls)]})
        out = [head | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        out.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason}]})
        if include_usage:
            out.append(head | {"choices": [], "usage": self.usage()})
        return out
