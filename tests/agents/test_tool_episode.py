"""The built-in tool episode: trained tokens are the generated ones, tool messages are what the
chat template renders, limits become messages and counters, an abort keeps what was done."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from asyncrl.agents import EngineClient, MessageTemplate, ToolEpisode
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.data.tokenization import encode_messages
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.types import GenerationRequest, PromptRow, SamplingParams, Trajectory
from tests.agents.fakes import TOK, AddTools, ScriptedModel, compact_calls

QUESTION = "What is 12+30?"
CALL = "<tool_call>add 12+30</tool_call>"
ANSWER = "The answer is 42"
QWEN_STYLE = (  # written for this test in the layout of Qwen2.5's template (tool answers as user turns)
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_style_tokenizer():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = QWEN_STYLE
    return tok


def prompt(tok) -> tuple[int, ...]:
    return tuple(encode_messages(tok, [{"role": "user", "content": QUESTION}], tok.chat_template))


def run(model: ScriptedModel, tools: AddTools, tok=TOK, partial: Trajectory | None = None,
        max_response_tokens: int = 300, **limits) -> Trajectory:
    cfg = MultiTurnConfig(enable=True, format="compact", **limits)
    episode = ToolEpisode(cfg, tools, compact_calls, MessageTemplate(tok))
    base = GenerationRequest("g/0", prompt(tok), SamplingParams(max_tokens=max_response_tokens, seed=7))
    row = PromptRow(uid="p", data_source="x", messages=(), ground_truth="42", prompt_ids=base.prompt_ids)
    client = EngineClient(base, model, tok, max_response_tokens=max_response_tokens)
    return asyncio.run(episode(row, client, partial))


def two_turns(k: int) -> str:
    return CALL if k == 0 else ANSWER


@pytest.mark.parametrize("tok, marker", [(TOK, "<|tool|>"), (qwen_style_tokenizer(), "<tool_response>")],
                         ids=["tiny", "qwen_style"])
def test_response_is_the_generated_ids_and_the_tool_message_as_the_template_renders(tok, marker):
    model = ScriptedModel(two_turns, version=3, tok=tok, marker=marker)
    traj = run(model, AddTools(), tok)
    turn1 = tok.encode(CALL + tok.eos_token, add_special_tokens=False)
    turn2 = tok.encode(ANSWER + tok.eos_token, add_special_tokens=False)
    tool = MessageTemplate(tok).encode("42")
    assert list(traj.response_ids) == turn1 + tool + turn2  # model tokens as generated, never re-tokenised
    assert list(traj.loss_mask) == [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    assert list(traj.logprobs) == [-(t + 1) / 100 for t in range(len(turn1))] + [0.0] * len(tool) + \
        [-(t + 1) / 100 for t in range(len(turn2))]
    assert set(traj.versions) == {3} and len(traj.versions) == len(traj.response_ids)
    assert traj.finish_reason == "stop" and traj.request_id == "g/0"
    assert traj.episode == {"num_turns": 2, "tool_calls": 1, "tool_time_s": 0.0, "tool_errors": 0,
                            "tool_truncated": 0, "tool_limited": 0, "user_turns": 1}
    # what the chat template renders for the whole conversation, tokenised at once
    conversation = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": "42"}, {"role": "assistant", "content": ANSWER}]
    rendered = tok.apply_chat_template(conversation, tokenize=False)
    rendered = rendered[: rendered.rindex(tok.eos_token) + len(tok.eos_token)]  # the model stops at its EOS
    assert list(traj.prompt_ids) + list(traj.response_ids) == tok.encode(rendered, add_special_tokens=False)
    # the second turn was asked for with the whole conversation as context, and a later seed
    second = model.requests[1]
    assert list(second.prompt_ids) == list(traj.prompt_ids) + turn1 + tool
    assert second.params.seed == 7 + len(turn1) + len(tool) and model.requests[0].params.seed == 7
    assert second.request_id == "g/0#1" and second.params.max_tokens == 300 - len(turn1) - len(tool)


def test_a_turn_without_a_call_ends_the_episode_and_no_tool_runs():
    tools = AddTools()
    traj = run(ScriptedModel(lambda k: ANSWER), tools)
    assert tools.calls == [] and traj.episode == {"num_turns": 1} and traj.finish_reason == "stop"
    assert list(traj.loss_mask) == [1] * len(traj.response_ids)


def test_calls_past_max_tool_calls_become_a_message_and_are_counted():
    script = lambda k: "<tool_call>add 1+2</tool_call><tool_call>add 3+4</tool_call>" if k == 0 else ANSWER  # noqa: E731
    tools = AddTools()
    traj = run(ScriptedModel(script), tools, max_tool_calls=1, max_tool_response_length=9)
    assert [c.arguments["expression"] for c in tools.calls] == ["1+2"] and tools.max_chars == [9]
    text = TOK.decode([t for t, m in zip(traj.response_ids, traj.loss_mask) if m == 0])
    assert text == ("<|tool|>3\nerror: add: not run, past the tool call limit (max_tool_calls=1 per episode, "
                    "max_parallel_calls=0 per turn)<|end|><|assistant|>")
    assert traj.episode["tool_calls"] == 1 and traj.episode["tool_limited"] == 1


def test_calls_past_max_parallel_calls_in_one_turn_are_refused():
    three = "<tool_call>add 1+2</tool_call><tool_call>add 3+4</tool_call><tool_call>add 5+6</tool_call>"
    tools = AddTools()
    traj = run(ScriptedModel(lambda k: three if k < 2 else ANSWER), tools, max_response_tokens=2000,
               max_parallel_calls=2, max_tool_calls=3)
    assert [c.arguments["expression"] for c in tools.calls] == ["1+2", "3+4", "1+2"]  # 2, then the episode's last
    assert traj.episode["tool_calls"] == 3 and traj.episode["tool_limited"] == 3


def test_unparsable_calls_and_failing_tools_are_messages_and_errors():
    script = lambda k: "<tool_call> </tool_call><tool_call>boom 1</tool_call>" if k == 0 else ANSWER  # noqa: E731
    traj = run(ScriptedModel(script), AddTools())
    text = TOK.decode([t for t, m in zip(traj.response_ids, traj.loss_mask) if m == 0])
    assert text == "<|tool|>unknown tool boom\nerror: empty call<|end|><|assistant|>"
    assert traj.episode["tool_errors"] == 2 and traj.finish_reason == "stop"


@pytest.mark.parametrize("limits", [{"max_assistant_turns": 2}, {"max_user_turns": 1}])
def test_a_call_after_the_last_allowed_turn_ends_the_episode(limits):
    tools = AddTools()
    traj = run(ScriptedModel(lambda k: CALL), tools, **limits)  # the model never stops calling
    assert traj.episode["num_turns"] == 2 and traj.episode["user_turns"] == 1 and len(tools.calls) == 1
    assert traj.episode["turn_limited"] == 1 and traj.finish_reason == "stop"


def test_the_response_budget_ends_the_episode_with_length():
    turn1 = len(TOK.encode(CALL + TOK.eos_token, add_special_tokens=False))
    tool = len(MessageTemplate(TOK).encode("42"))
    traj = run(ScriptedModel(two_turns), AddTools(), max_response_tokens=turn1 + tool)  # no room for turn 2
    assert traj.finish_reason == "length" and len(traj.response_ids) == turn1
    traj = run(ScriptedModel(two_turns), AddTools(), max_response_tokens=turn1 + tool + 5)
    assert traj.finish_reason == "length" and len(traj.response_ids) == turn1 + tool + 5


def test_an_episode_stopped_inside_a_turn_continues_that_turn_and_equals_an_unstopped_one():
    whole = run(ScriptedModel(two_turns), AddTools())
    tools = AddTools()
    stopped = run(ScriptedModel(two_turns, cut={1: 4}), tools)  # aborted 4 tokens into turn 2
    turn1 = len(TOK.encode(CALL + TOK.eos_token, add_special_tokens=False))
    tool = len(MessageTemplate(TOK).encode("42"))
    assert stopped.finish_reason == "aborted" and len(stopped.response_ids) == turn1 + tool + 4
    assert stopped.episode["num_turns"] == 2 and len(tools.calls) == 1
    model = ScriptedModel(two_turns, version=1)
    resumed = run(model, tools, partial=stopped)
    assert len(tools.calls) == 1  # the tool is never run again
    assert list(model.requests[0].prefix_ids) == list(stopped.response_ids[turn1 + tool:])
    assert model.requests[0].params.seed == 7 + turn1 + tool + 4
    assert resumed.response_ids == whole.response_ids and resumed.logprobs == whole.logprobs
    assert resumed.loss_mask == whole.loss_mask and resumed.episode == whole.episode
    versions = list(resumed.versions)  # earlier tokens keep their version, the rest are the new one's
    assert versions == [0] * (turn1 + tool + 4) + [1] * (len(versions) - turn1 - tool - 4)


def test_an_episode_stopped_between_turns_starts_the_next_turn():
    whole = run(ScriptedModel(two_turns), AddTools())
    stopped = run(ScriptedModel(two_turns, cut={1: 0}), AddTools())  # stopped as turn 2 began
    assert stopped.finish_reason == "aborted" and stopped.loss_mask[-1] == 0
    assert stopped.episode["num_turns"] == 1
    resumed = run(ScriptedModel(two_turns), AddTools(), partial=stopped)
    assert resumed.response_ids == whole.response_ids and resumed.episode == whole.episode


def test_a_turn_continued_after_a_stop_is_counted_once():
    stopped = run(ScriptedModel(two_turns, cut={0: 5}), AddTools())  # stopped 5 tokens into turn 1
    assert stopped.episode == {"num_turns": 1} and list(stopped.loss_mask) == [1] * 5
    resumed = run(ScriptedModel(two_turns), AddTools(), partial=dataclasses.replace(stopped))
    assert resumed.episode["num_turns"] == 2
