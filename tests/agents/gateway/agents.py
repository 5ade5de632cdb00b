"""Agents for the episode tests, written against the OpenAI client only (named by module:function)."""

from __future__ import annotations

import asyncio

import openai

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


async def tool_loop(row, client):
    """Call, run the calculator on the call, call again; score the answer itself."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    msg = first.choices[0].message
    a, b = msg.tool_calls[0].function.arguments.split('"')[3].split("+")
    answer = {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": str(int(a) + int(b))}
    messages += [msg.model_dump(), answer]
    last = await client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    right = last.choices[0].message.content.endswith(row["reward_model"]["ground_truth"])
    return {"correct": float(right), "bonus": 0.5}


async def one_call(row, client):
    await client.chat.completions.create(model="policy", messages=list(row["prompt"]))
    return 0.25


async def by_url(row, base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    await client.chat.completions.create(model="policy", messages=list(row["prompt"]))
    await client.close()
    return None


async def raises(row, client):
    await client.chat.completions.create(model="policy", messages=list(row["prompt"]))
    raise RuntimeError("the agent broke")


async def hangs(row, client):
    await asyncio.sleep(60)


async def never_calls(row, client):
    return 1.0


async def stubborn(row, client):
    """Calls until refused (the turn limit), then gives up with the error."""
    while True:
        await client.chat.completions.create(model="policy", messages=list(row["prompt"]))


async def tool_loop_unscored(row, client):
    """`tool_loop`, leaving the score to the run's reward function."""
    await tool_loop(row, client)
    return None


BEFORE_CALL: list = []
"""Callables run before each call of `two_calls` (a test's hook: request a stop mid-run)."""


async def two_calls(row, client):
    """Two calls of one conversation (a user reply between them), scored by the run's reward function."""
    messages = list(row["prompt"])
    for _ in range(2):
        for hook in BEFORE_CALL:
            hook()
        done = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        messages += [done.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
    return None


async def edits_history(row, client):
    """Two calls; the second asks again with the question edited (no extension of the first: a new chain)."""
    question = row["prompt"][-1]["content"]
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}])
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question + " Sure?"}])
    return 0.75
