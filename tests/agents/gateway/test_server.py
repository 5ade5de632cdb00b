"""The endpoint through the `openai` package's own client: answers, tool calls, streaming, errors,
and isolation between episodes."""

from __future__ import annotations

import asyncio
import json

import httpx2
import openai
import pytest

from asyncrl.agents.gateway import Gateway
from asyncrl.agents.gateway.client import in_process_client
from tests.agents.gateway.helpers import CALC, QUESTION, session


def run(coro):
    return asyncio.run(coro)


def test_a_tool_call_round_trips_through_the_openai_client():
    async def go():
        gw = Gateway(1 << 20)
        s = session()
        api = in_process_client(gw, gw.open(s))
        first = await api.chat.completions.create(model="anything", messages=[QUESTION], tools=[CALC])
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and msg.tool_calls[0].function.name == "calculator"
        assert json.loads(msg.tool_calls[0].function.arguments) == {"expression": "12+30"}
        tool = {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42"}
        second = await api.chat.completions.create(model="x", messages=[QUESTION, msg.model_dump(), tool],
                                                   tools=[CALC])
        assert second.choices[0].message.content == "Answer: 42" and second.usage.completion_tokens > 0
        assert [m.id for m in (await api.models.list()).data] == ["policy"]
        return s

    s = run(go())
    assert len(s.book.chains) == 1


def test_streaming_yields_the_same_answer():
    async def go():
        gw = Gateway(1 << 20)
        api = in_process_client(gw, gw.open(session()))
        stream = await api.chat.completions.create(model="policy", messages=[QUESTION], tools=[CALC], stream=True,
                                                   stream_options={"include_usage": True})
        return [chunk async for chunk in stream]

    chunks = run(go())
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "calculator"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize(("body", "status"), [
    ({"messages": [QUESTION], "n": 2}, 400),
    ({"messages": [QUESTION], "max_tokens": 10_000}, 400),
    ({"messages": "hello"}, 422),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 422),
    ({"messages": [QUESTION], "pad": "x" * 5000}, 413),
])
def test_bad_requests_are_openai_errors_with_their_status(body, status):
    async def go():
        gw = Gateway(4096)
        token = gw.open(session())
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gw.app), base_url="http://t") as http:
            return await http.post(f"/ep/{token}/v1/chat/completions", json=body)

    answer = run(go())
    assert answer.status_code == status
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_an_episode_cannot_reach_another_and_an_ended_one_is_gone():
    async def go():
        gw = Gateway(1 << 20)
        mine, theirs = session(eid="a"), session(eid="b")
        token = gw.open(mine)
        gw.open(theirs)
        api = in_process_client(gw, token)
        await api.chat.completions.create(model="p", messages=[QUESTION])
        guess = in_process_client(gw, token[:-2] + ("AA" if not token.endswith("AA") else "BB"))
        with pytest.raises(openai.NotFoundError):
            await guess.chat.completions.create(model="p", messages=[QUESTION])
        gw.close(token)
        with pytest.raises(openai.NotFoundError):
            await api.chat.completions.create(model="p", messages=[QUESTION])
        return mine, theirs, gw

    mine, theirs, gw = run(go())
    assert mine.calls == 1 and theirs.calls == 0 and gw.late_calls == 1


def test_limits_are_refused_with_their_status():
    async def go():
        gw = Gateway(1 << 20)
        capped = session(max_turns=1)
        api = in_process_client(gw, gw.open(capped))
        await api.chat.completions.create(model="p", messages=[QUESTION])
        with pytest.raises(openai.BadRequestError, match="max_assistant_turns"):
            await api.chat.completions.create(model="p", messages=[QUESTION])
        stopped = in_process_client(gw, gw.open(session(stopped=lambda: True)))
        with pytest.raises(openai.ConflictError):
            await stopped.chat.completions.create(model="p", messages=[QUESTION])
        return capped

    assert run(go()).limited


def test_the_listener_binds_loopback_and_serves_a_plain_client():
    async def go():
        gw = Gateway(1 << 20)
        token = gw.open(session())
        await gw.serve("127.0.0.1")
        try:
            api = openai.AsyncOpenAI(base_url=gw.base_url("127.0.0.1", token), api_key="x", max_retries=0)
            done = await api.chat.completions.create(model="p", messages=[QUESTION], logprobs=True)
            await api.close()
            return done
        finally:
            await gw.shutdown()

    done = run(go())
    assert done.choices[0].message.tool_calls and len(done.choices[0].logprobs.content) > 0
