"""The in-process episode client: a real `openai.AsyncOpenAI` whose plain chat calls skip HTTP.

An in-process agent's `client.chat.completions.create(...)` (not streamed, not `with_raw_response`)
goes straight to its episode's `Gateway.answer`, the call the HTTP route makes, and comes back as
the SDK's own `ChatCompletion` (built as the SDK builds it), its errors as the SDK's own exceptions
(built from the same status and body). What it skips is the SDK's request transform and the
HTTP round trip: about 1 ms of Python a call, which 64 agents on the rollout host's event loop
pay one after another (docs/agents.md, "Speed"), as AReaL's ArealOpenAI skips them. Everything
else (streaming, raw responses, `models.list`, a `with_options` copy) takes the SDK's path through
the in-process app, so both paths answer the same (tests/agents/gateway/test_client.py).
Not here: the routes (`server`), the calls themselves (`session`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import pydantic
from openai.resources.chat import AsyncChat, AsyncCompletions
from openai.types.chat import ChatCompletion

from asyncrl.agents.gateway.chat import ApiError

if TYPE_CHECKING:
    from asyncrl.agents.gateway.server import Gateway

CALL_OPTIONS = ("extra_headers", "extra_query", "extra_body", "timeout")
"""`create`'s keywords that are not the request body."""


def in_process_client(gateway: Gateway, token: str) -> openai.AsyncOpenAI:
    """An `openai.AsyncOpenAI` bound to this episode that reaches the app in-process (no socket)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gateway.app), timeout=None)
    return EpisodeOpenAI(base_url=f"http://asyncrl.local/ep/{token}/v1", api_key="asyncrl-episode",
                         http_client=http, max_retries=0, episode=(gateway, token))


class EpisodeOpenAI(openai.AsyncOpenAI):
    """`openai.AsyncOpenAI` with `chat.completions.create` answered in-process when plain."""

    def __init__(self, *args: Any, episode: tuple[Gateway, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episode = episode
        """The gateway and the episode's token; None on a copy (`with_options`): the SDK's path."""

    @cached_property
    def chat(self) -> AsyncChat:
        return _Chat(self)


class _Chat(AsyncChat):
    @cached_property
    def completions(self) -> AsyncCompletions:
        return _Completions(self._client)


class _Completions(AsyncCompletions):
    async def create(self, **kwargs: Any) -> Any:  # the SDK's keywords, passed on
        episode = getattr(self._client, "episode", None)
        headers = kwargs.get("extra_headers") or {}
        sdk_only = kwargs.get("stream") or kwargs.get("extra_query") or "messages" not in kwargs \
            or "model" not in kwargs or any(str(h).lower().startswith("x-stainless") for h in headers)
        if episode is None or sdk_only:  # a stream, a raw response, a missing argument: the SDK's path
            return await super().create(**kwargs)
        gateway, token = episode
        body = plain({k: v for k, v in kwargs.items() if k not in CALL_OPTIONS}) | plain(kwargs.get("extra_body") or {})
        try:
            gateway.check_size(len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()))  # as sent
            req, done = await gateway.answer(token, body, in_process=True)
        except ApiError as err:
            answer = httpx2.Response(err.status, json=err.body(),
                                     request=httpx2.Request("POST", f"{self._client.base_url}chat/completions"))
            raise self._client._make_status_error_from_response(answer) from None
        return ChatCompletion.construct(**done.body(req.logprobs))


def plain(value: Any) -> Any:
    """A `create` argument as the SDK sends it: models dumped as set, iterables as lists, the
    omitted (`openai.omit`, `NOT_GIVEN`) left out."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(exclude_unset=True, mode="json")
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items() if not isinstance(v, (openai.Omit, openai.NotGiven))}
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return value
    return [plain(v) for v in value]
