"""Token-exact chains: calls that extend a conversation keep its sampled ids; others start a chain."""

from __future__ import annotations

import asyncio
import copy
import json

from asyncrl.agents.gateway.chat import parse_request
from tests.agents.gateway.helpers import CALC, QUESTION, TOOL_TOK, CharModel, session, two_turns


def call(s, messages, tools=(CALC,)):
    return asyncio.run(s.complete(parse_request({"messages": messages, "tools": list(tools)})))


def follow_up(done, tool_text="42"):
    """The assistant message returned (as a client sends it back) and a tool result."""
    body = done.body(False)["choices"][0]["message"]
    return [body, {"role": "tool", "tool_call_id": body["tool_calls"][0]["id"], "content": tool_text}]


def test_extending_calls_form_one_chain_with_only_new_messages_tokenised():
    s = session()
    first = call(s, [QUESTION])
    assert first.finish_reason == "tool_calls"
    assert json.loads(first.message.tool_calls[0].arguments) == {"expression": "12+30"}
    second = call(s, [QUESTION, *follow_up(first)])
    assert second.message.content == "Answer: 42" and second.finish_reason == "stop"
    (chain,) = s.book.chains
    tool_ids = TOOL_TOK.encode("<|tool|>42<|end|><|assistant|>", add_special_tokens=False)
    ep = chain.builder
    assert list(ep.response_ids) == [*first.token_ids, *tool_ids, *second.token_ids]
    assert ep.loss_mask == [1] * len(first.token_ids) + [0] * len(tool_ids) + [1] * len(second.token_ids)
    assert second.prompt_tokens - second.cached_tokens == len(tool_ids)  # only the tool message is new
    counters = s.trajectory_counters()
    assert counters["agent/chains"] == 1 and counters["agent/calls"] == 2 and counters["agent/retokenized_tokens"] == 0


def test_sampled_ids_that_reencode_differently_are_trained_as_sampled():
    model = CharModel(two_turns)
    s = session(model)
    first = call(s, [QUESTION])
    text = "<tool_call>calculator 12+30</tool_call>"
    assert TOOL_TOK.encode(text, add_special_tokens=False) != model.sampled[0][:-1]  # the drift is real
    assert first.message.tool_calls[0].name == "calculator"  # parsed from the decoded text
    call(s, [QUESTION, *follow_up(first)])
    (chain,) = s.book.chains
    ep = chain.builder
    trained = [t for t, m in zip(ep.response_ids, ep.loss_mask) if m == 1]
    assert trained == model.sampled[0] + model.sampled[1]
    assert [lp for lp, m in zip(ep.logprobs, ep.loss_mask) if m == 1] == [-0.5] * len(trained)
    assert s.trajectory_counters()["agent/retokenized_tokens"] == 0


def test_a_call_that_edits_history_starts_a_new_chain_and_counts_what_it_retokenises():
    s = session()
    first = call(s, [QUESTION])
    edited = [{"role": "user", "content": "What is 1+1?"}, *follow_up(first)]
    call(s, edited)
    assert len(s.book.chains) == 2
    counters = s.trajectory_counters()
    assert counters["agent/chains"] == 2 and counters["agent/retokenized_tokens"] == len(first.token_ids)
    assert s.last is s.book.chains[1]


def test_other_tools_start_a_new_chain():
    s = session()
    first = call(s, [QUESTION])
    call(s, [QUESTION, *follow_up(first)], tools=())
    assert len(s.book.chains) == 2


def test_a_template_that_rewrites_past_assistant_turns_starts_a_new_chain():
    dropping = copy.deepcopy(TOOL_TOK)
    dropping.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] != 'assistant' or loop.last %}"
                              "{{ m['content'] }}{% endif %}<|end|>{% endfor %}"
                              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    s = session(tok=dropping)
    first = call(s, [QUESTION])
    call(s, [QUESTION, *follow_up(first)])
    assert len(s.book.chains) == 2 and s.book.counters["template_rewrites"] == 1


def test_a_message_sent_back_reshaped_by_a_client_still_continues_the_chain():
    s = session()
    first = call(s, [QUESTION])
    body, tool = follow_up(first)
    args = json.loads(body["tool_calls"][0]["function"]["arguments"])
    body = {**body, "content": [], "tool_calls": [{**body["tool_calls"][0], "function": {
        "name": "calculator", "arguments": json.dumps(args, indent=2)}}]}  # other spacing, content as parts
    call(s, [QUESTION, body, tool])
    assert len(s.book.chains) == 1
