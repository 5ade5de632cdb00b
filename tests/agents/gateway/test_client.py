"""The in-process client's direct path answers as the SDK's own path through the app: the same
request reaches the session, the same ChatCompletion and the same exceptions come back, and a
test asserts which path each call took."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from asyncrl.agents.gateway import Gateway
from asyncrl.agents.gateway.client import in_process_client
from asyncrl.agents.gateway.episode import load_agent
from tests.agents.gateway.helpers import CALC, QUESTION, session

SYSTEM = {"role": "system", "content": "You add numbers."}


def recorded(s: Any) -> Any:
    """`s` with the requests its `complete` received kept in `s.requests`."""
    inner, s.requests = s.complete, []

    async def complete(req: Any) -> Any:
        s.requests.append(req)
        return await inner(req)

    s.complete = complete
    return s


async def both(call: Any, max_bytes: int = 1 << 20) -> list[tuple[Any, Any, int]]:
    """`call(client)` on the direct path and on the SDK's (a `with_options` copy), each on a fresh
    episode: (the answer or the exception, the session, calls taken directly)."""
    out = []
    for direct in (True, False):
        gw = Gateway(max_bytes)
        s = recorded(session())
        api = in_process_client(gw, gw.open(s))
        try:
            answer = await call(api if direct else api.with_options(timeout=30))
        except openai.APIStatusError as err:
            answer = err
        out.append((answer, s, gw.in_process_calls))
    return out


async def second_call(api: Any, **kwargs: Any) -> Any:
    """A tool call, its answer fed back as the SDK's own message object, then the final call."""
    first = await api.chat.completions.create(model="policy", messages=[SYSTEM, QUESTION], tools=[CALC])
    msg = first.choices[0].message
    tool = {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42"}
    return await api.chat.completions.create(model="policy", messages=(m for m in [SYSTEM, QUESTION, msg, tool]),
                                             tools=[CALC], **kwargs)


CALLS = {
    "dicts and tools": lambda api: api.chat.completions.create(model="p", messages=[QUESTION], tools=[CALC]),
    "omitted and given options": lambda api: api.chat.completions.create(
        model="p", messages=[QUESTION], temperature=openai.omit, top_p=openai.NOT_GIVEN, max_completion_tokens=40,
        stop="\n\n", logprobs=True, tool_choice="auto", extra_headers={"User-Agent": "Agents/Python"},
        extra_body={"top_k": 5}),
    "a model object and a generator": lambda api: second_call(api, temperature=0.7),
}


@pytest.mark.parametrize("name", CALLS)
def test_the_direct_path_answers_as_the_sdks_path(name):
    (direct, s_direct, fast), (sdk, s_sdk, slow) = asyncio.run(both(CALLS[name]))
    assert fast == len(s_direct.requests) >= 1 and slow == 0
    assert s_direct.requests == s_sdk.requests
    assert type(direct) is type(sdk) is openai.types.chat.ChatCompletion
    assert direct.model_dump(exclude={"created"}) == sdk.model_dump(exclude={"created"})
    assert direct.choices[0].message.content is not None or direct.choices[0].message.tool_calls


def create(**body: Any) -> Any:
    return lambda api: api.chat.completions.create(**{"model": "p", "messages": [QUESTION]} | body)


@pytest.mark.parametrize(("call", "status"), [
    (create(n=2), 400),
    (create(max_tokens=10_000), 400),
    (create(messages="hello"), 422),
    (create(messages=[{"role": "wizard", "content": "x"}]), 422),
    (create(extra_body={"pad": "x" * 5000}), 413),
])
def test_the_direct_path_raises_the_sdks_exceptions(call, status):
    (direct, _, _), (sdk, _, _) = asyncio.run(both(call, max_bytes=4096))
    assert type(direct) is type(sdk) and direct.status_code == sdk.status_code == status
    assert direct.body == sdk.body and str(direct) == str(sdk)


def test_streams_raw_responses_and_copies_take_the_sdks_path():
    async def go():
        gw = Gateway(1 << 20)
        api = in_process_client(gw, gw.open(session(max_turns=9)))
        stream = await api.chat.completions.create(model="p", messages=[QUESTION], stream=True)
        chunks = [c async for c in stream]
        raw = await api.chat.completions.with_raw_response.create(model="p", messages=[QUESTION])
        await api.with_options(max_retries=1).chat.completions.create(model="p", messages=[QUESTION])
        sdk_calls = gw.in_process_calls
        await api.chat.completions.create(model="p", messages=[QUESTION])
        return chunks, raw, sdk_calls, gw.in_process_calls

    chunks, raw, sdk_calls, after = asyncio.run(go())
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and raw.http_response.status_code == 200
    assert raw.parse().choices[0].message.tool_calls
    assert (sdk_calls, after) == (0, 1)


def test_an_unknown_or_ended_episode_is_a_not_found_error_on_the_direct_path():
    async def go():
        gw = Gateway(1 << 20)
        token = gw.open(session())
        api = in_process_client(gw, token)
        gw.close(token)
        with pytest.raises(openai.NotFoundError, match="unknown or expired"):
            await api.chat.completions.create(model="p", messages=[QUESTION])
        return gw

    assert asyncio.run(go()).late_calls == 1


def test_the_sdk_agent_takes_the_direct_path_on_every_call():
    agent, _ = load_agent("examples/openai_agents_calculator.py:agent")

    async def go():
        gw = Gateway(1 << 20)
        s = session()
        await agent({"prompt": [QUESTION]}, in_process_client(gw, gw.open(s)))
        return s, gw

    s, gw = asyncio.run(go())
    assert s.calls == 2 and gw.in_process_calls == 2  # the calculator call, then the answer
