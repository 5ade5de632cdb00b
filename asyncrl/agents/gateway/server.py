"""The episode endpoint: OpenAI's chat-completions API over the rollout host's engine.

    POST {base}/v1/chat/completions    GET {base}/v1/models       base = http://HOST:PORT/ep/TOKEN

One app per rollout host. Each episode gets an unguessable TOKEN (`secrets.token_urlsafe`, 192
bits) in its URL; a call with an unknown or expired token is a 404, so one episode can neither
read nor write another's calls, and an agent calling after its episode ended is counted
(`late_calls`). The body is bounded (`rollout.agent.max_request_bytes`, 413), errors are OpenAI
error objects (400, 404, 409, 413, 422, 429), never a traceback. `stream=true` answers with
server-sent events (the whole turn is generated first: the trained tokens are the turn's).

Starlette on uvicorn: the ASGI stack FastAPI is built on, without the schema layer we do not
need (the request is checked by `chat.parse_request` to OpenAI's error shapes). In-process
agents reach it with no socket (`client.in_process_client`: plain calls straight to `answer`,
the rest through the app); a uvicorn listener on loopback (`rollout.agent.host`) serves agents
given a base_url (`serve`).
Not here: what a call does (`session`), the agent's lifetime (`asyncrl.agents.gateway.episode`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from asyncrl.agents.gateway.chat import MODEL_NAME, ApiError, ChatRequest, Completion, parse_request
from asyncrl.agents.gateway.session import AgentSession

log = logging.getLogger(__name__)
EXPIRED_KEPT = 4096
"""Ended tokens remembered, to count an agent's late calls (still a 404)."""


class Gateway:
    """The app and the episodes it serves (token -> session)."""

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes
        self.sessions: dict[str, AgentSession] = {}
        self.expired: OrderedDict[str, None] = OrderedDict()
        self.late_calls = 0
        self.in_process_calls = 0
        """Calls answered without HTTP (`client.EpisodeOpenAI`)."""
        self.app = Starlette(routes=[
            Route("/ep/{token}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/ep/{token}/v1/models", self._models, methods=["GET"]),
        ])
        self._server: Any = None
        self.port = 0

    def open(self, session: AgentSession) -> str:
        """A new episode's token."""
        token = secrets.token_urlsafe(24)
        self.sessions[token] = session
        return token

    def close(self, token: str) -> None:
        session = self.sessions.pop(token, None)
        if session is not None:
            session.ended = True
        self.expired[token] = None
        while len(self.expired) > EXPIRED_KEPT:
            self.expired.popitem(last=False)

    def _session(self, token: str) -> AgentSession:
        session = self.sessions.get(token)
        if session is None:
            if token in self.expired:
                self.late_calls += 1
                log.warning("agent: a call after its episode ended (counted in agent/late_calls)")
            raise ApiError(404, "unknown or expired episode URL", code="episode_not_found")
        return session

    async def _models(self, request: Request) -> Response:
        try:
            self._session(request.path_params["token"])
        except ApiError as err:
            return JSONResponse(err.body(), status_code=err.status)
        return JSONResponse({"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0,
                                                         "owned_by": "asyncrl"}]})

    async def answer(self, token: str, body: Any, *, in_process: bool = False) -> tuple[ChatRequest, Completion]:
        """A chat call of the episode `token`: the request checked (`parse_request`), its turn."""
        session = self._session(token)
        req = parse_request(body)
        self.in_process_calls += in_process
        return req, await session.complete(req)

    def check_size(self, size: int) -> None:
        if size > self.max_request_bytes:
            raise ApiError(413, f"the request is {size} bytes, more than rollout.agent.max_request_bytes="
                           f"{self.max_request_bytes}", code="request_too_large")

    async def _chat(self, request: Request) -> Response:
        try:
            token = request.path_params["token"]
            self._session(token)  # an unknown episode's body is not read
            req, done = await self.answer(token, await self._body(request))
        except ApiError as err:
            return JSONResponse(err.body(), status_code=err.status)
        if not req.stream:
            return JSONResponse(done.body(req.logprobs))
        return StreamingResponse(_events(done.chunks(req.include_usage)), media_type="text/event-stream")

    async def _body(self, request: Request) -> Any:
        self.check_size(int(request.headers.get("content-length") or 0))
        data = b""
        async for part in request.stream():
            data += part
            self.check_size(len(data))
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON ({exc})", code="invalid_json") from exc

    async def serve(self, host: str) -> int:
        """Start the uvicorn listener on `host` (a free port) once; its port."""
        if self._server is None:
            import uvicorn

            config = uvicorn.Config(self.app, host=host, port=0, log_level="warning", lifespan="off")
            self._server = uvicorn.Server(config)
            self._task = asyncio.ensure_future(self._server.serve())
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # raises the listener's failure
                await asyncio.sleep(0.01)
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.port

    def base_url(self, host: str, token: str) -> str:
        return f"http://{host}:{self.port}/ep/{token}/v1"

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            await self._task
            self._server = None


async def _events(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"

