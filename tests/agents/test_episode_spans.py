"""The tool episode records its model turns and tool calls as spans in `Trajectory.timings`
(`asyncrl.telemetry.episode_spans`) for the trace view."""

from __future__ import annotations

import asyncio

from asyncrl.agents import EngineClient, MessageTemplate, ToolEpisode
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.data.tokenization import encode_messages
from asyncrl.telemetry.clock import use_clock
from asyncrl.telemetry.episode_spans import EpisodeSpan, read_spans, span_timings
from asyncrl.types import GenerationRequest, PromptRow, SamplingParams, Trajectory
from tests.agents.fakes import TOK, AddTools, ScriptedModel, compact_calls

TWO_CALLS = "<tool_call>add 1+2</tool_call><tool_call>nope 3</tool_call>"
ANSWER = "It is 3"
PROMPT = tuple(encode_messages(TOK, [{"role": "user", "content": "1+2?"}], TOK.chat_template))


class TickingClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def run(model: ScriptedModel, partial: Trajectory | None = None) -> Trajectory:
    episode = ToolEpisode(MultiTurnConfig(enable=True, format="compact"), AddTools(), compact_calls,
                          MessageTemplate(TOK))
    base = GenerationRequest("g/0", PROMPT, SamplingParams(max_tokens=300, seed=1))
    row = PromptRow(uid="p", data_source="x", messages=(), ground_truth="3", prompt_ids=PROMPT)
    with use_clock(TickingClock()):
        return asyncio.run(episode(row, EngineClient(base, model, TOK, max_response_tokens=300), partial))


def test_span_keys_round_trip_in_the_order_recorded():
    timings = {"gen_start": 1.0}
    for i in range(12):  # past 10: the order is numeric, not the keys' text order
        timings |= span_timings(i, "tool:a/b" if i == 11 else "turn", i, i + 0.5, {"status": "x/y", "tokens": i})
    spans = read_spans(timings)
    assert [s.start for s in spans] == list(range(12))
    assert spans[11] == EpisodeSpan("tool:a/b", 11.0, 11.5, {"status": "x_y", "tokens": 11})
    assert read_spans({"gen_start": 1.0, "span/0/turn/start": 2.0}) == []  # no end: not a span


def test_calls_of_one_turn_are_spans_from_one_start_with_their_status():
    traj = run(ScriptedModel(lambda k: TWO_CALLS if k == 0 else ANSWER))
    turn1, add, nope, turn2 = read_spans(traj.timings)
    assert (turn1.name, add.name, nope.name, turn2.name) == ("turn", "tool:add", "tool:nope", "turn")
    assert add.start == nope.start >= turn1.end and turn2.start >= max(add.end, nope.end)
    assert (add.args["status"], nope.args["status"]) == ("ok", "unknown_tool")
    assert [s.args["turn"] for s in (turn1, add, nope, turn2)] == [1, 1, 1, 2]
    assert turn1.args["tokens"] + turn2.args["tokens"] == sum(traj.loss_mask)


def test_a_resumed_episode_records_its_own_segment_and_keeps_the_turn_number():
    stopped = run(ScriptedModel(lambda k: TWO_CALLS if k == 0 else ANSWER, cut={1: 3}))  # 3 tokens into turn 2
    assert [(s.name, s.args.get("finish")) for s in read_spans(stopped.timings)][-1] == ("turn", "aborted")
    resumed = run(ScriptedModel(lambda k: TWO_CALLS if k == 0 else ANSWER), partial=stopped)
    spans = read_spans(resumed.timings)
    assert [(s.name, s.args["turn"], s.args["tokens"]) for s in spans] == [
        ("turn", 2, len(TOK.encode(ANSWER + TOK.eos_token, add_special_tokens=False)) - 3)]


def test_a_tool_name_the_model_made_up_is_cut_in_its_span_name():
    long_name = "calc" * 30
    traj = run(ScriptedModel(lambda k: f"<tool_call>{long_name} 1</tool_call>" if k == 0 else ANSWER))
    tool = read_spans(traj.timings)[1]
    assert tool.name == "tool:" + long_name[:64] and tool.args["status"] == "unknown_tool"
