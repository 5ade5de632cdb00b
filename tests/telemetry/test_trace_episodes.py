"""trace.json's episode view: a multi-turn episode's model turns and tool calls are spans on its
lane, inside its generation span, in the order they ran."""

from __future__ import annotations

import asyncio
import json

from asyncrl.agents import EngineClient, MessageTemplate, ToolEpisode
from asyncrl.config.schema import MultiTurnConfig
from asyncrl.data.tokenization import encode_messages
from asyncrl.telemetry import clock
from asyncrl.telemetry.clock import use_clock
from asyncrl.telemetry.episode_spans import span_timings
from asyncrl.telemetry.trace import Trace
from asyncrl.types import GenerationRequest, Group, PromptRow, SamplingParams, Trajectory
from tests.agents.fakes import TOK, AddTools, ScriptedModel, compact_calls

CALL = "<tool_call>add 12+30</tool_call>"
ANSWER = "The answer is 42"
ROW = PromptRow(uid="p", data_source="x", messages=(), ground_truth="42", prompt_ids=(1,))


class TickingClock:
    """Each reading is one second after the previous one."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def two_turn_episode() -> Trajectory:
    """The tool episode over a scripted model (turn 1 calls `add`, turn 2 answers), stamped with
    its generation span as the rollout server stamps it."""
    prompt = tuple(encode_messages(TOK, [{"role": "user", "content": "What is 12+30?"}], TOK.chat_template))
    episode = ToolEpisode(MultiTurnConfig(enable=True, format="compact"), AddTools(), compact_calls,
                          MessageTemplate(TOK))
    base = GenerationRequest("g/0", prompt, SamplingParams(max_tokens=300, seed=7))
    client = EngineClient(base, ScriptedModel(lambda k: CALL if k == 0 else ANSWER), TOK, max_response_tokens=300)
    start = clock.now()
    traj = asyncio.run(episode(ROW, client, None))
    traj.timings |= {"gen_start": start, "gen_end": clock.now(), "engine": 0}
    return traj


def x_events(path) -> list[dict]:
    """The file's spans in time order, each with its thread's name as `lane`."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e | {"lane": names[e["tid"]]} for e in events if e["ph"] == "X"]
    return sorted(spans, key=lambda e: (e["ts"], -e["dur"]))


def test_a_two_turn_episode_draws_its_turns_and_tool_call_on_its_lane(tmp_path):
    with use_clock(TickingClock()):
        trace = Trace()
        traj = two_turn_episode()
        trace.add_group(Group("p", ROW, [traj]), "rollout", step=None)
        assert trace.export(tmp_path / "trace.json")
    gen, turn1, tool, turn2 = x_events(tmp_path / "trace.json")
    assert [e["name"] for e in (gen, turn1, tool, turn2)] == ["gen", "turn", "tool:add", "turn"]
    assert {e["lane"] for e in (gen, turn1, tool, turn2)} == {"rollout0/gen"}
    assert turn1["ts"] + turn1["dur"] <= tool["ts"] and tool["ts"] + tool["dur"] <= turn2["ts"]
    assert gen["ts"] <= turn1["ts"] and turn2["ts"] + turn2["dur"] <= gen["ts"] + gen["dur"]
    mask = list(traj.loss_mask)
    first_turn_tokens = mask.index(0)
    assert turn1["args"] == {"turn": 1, "tokens": first_turn_tokens, "finish": "stop"}
    assert turn2["args"] == {"turn": 2, "tokens": len(mask) - first_turn_tokens - mask.count(0), "finish": "stop"}
    assert tool["args"] == {"status": "ok", "seconds": 0, "turn": 1}


def episode_traj(i: int, gen: tuple[float, float], parts: list[tuple[str, float, float]]) -> Trajectory:
    timings = {"gen_start": gen[0], "gen_end": gen[1], "engine": 0}
    for k, (name, start, end) in enumerate(parts):
        timings |= span_timings(k, name, start, end, {"turn": 1})
    return Trajectory(f"p/{i}", [1], [2, 3], [0.0, 0.0], [0, 0], "stop", timings=timings)


def test_overlapping_episodes_keep_their_parts_on_their_own_lanes_and_count_once_as_running(tmp_path):
    with use_clock(TickingClock()):
        trace = Trace()
    o = trace.origin
    a = episode_traj(0, (o, o + 10), [("turn", o, o + 4), ("tool:add", o + 4, o + 6), ("turn", o + 6, o + 10)])
    b = episode_traj(1, (o + 2, o + 8), [("turn", o + 2, o + 3), ("tool:python", o + 3, o + 8)])
    trace.add_group(Group("p", ROW, [a, b]), "rollout")
    trace.export(tmp_path / "t.json")
    lanes = [(e["name"], e["lane"]) for e in x_events(tmp_path / "t.json")]
    assert lanes == [("gen", "rollout0/gen"), ("turn", "rollout0/gen"), ("gen", "rollout0/gen #1"),
                     ("turn", "rollout0/gen #1"), ("tool:python", "rollout0/gen #1"), ("tool:add", "rollout0/gen"),
                     ("turn", "rollout0/gen")]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    running = [e["args"]["value"] for e in events if e["name"] == "running requests"]
    assert max(running) == 2 and running[-1] == 0  # two episodes, whatever their turns and calls


def test_parts_outside_the_generation_span_are_cut_to_it_and_tool_calls_run_at_once_nest(tmp_path):
    with use_clock(TickingClock()):
        trace = Trace()
    o = trace.origin
    # resumed: the first turn ran in an earlier segment; two calls started together, the longer first
    traj = episode_traj(0, (o + 5, o + 20), [("turn", o, o + 3), ("turn", o + 4, o + 8),
                                             ("tool:add", o + 8, o + 9), ("tool:python", o + 8, o + 12),
                                             ("turn", o + 12, o + 25)])
    trace.add_group(Group("p", ROW, [traj]), "rollout")
    trace.export(tmp_path / "t.json")
    spans = [(e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in x_events(tmp_path / "t.json")]
    assert spans == [("gen", 5, 20), ("turn", 5, 8), ("tool:python", 8, 12), ("tool:add", 8, 9), ("turn", 12, 20)]


def test_an_episodes_parts_are_sampled_with_its_group():
    with use_clock(TickingClock()):
        trace = Trace(max_events=12)
    o = trace.origin
    for i in range(4):  # each group: a gen span and three parts (no reward, no update)
        parts = [("turn", o + i, o + i + 0.3), ("tool:add", o + i + 0.3, o + i + 0.6), ("turn", o + i + 0.6, o + i + 1)]
        trace.add_group(Group(f"p{i}", ROW, [episode_traj(i, (o + i, o + i + 1), parts)]), "rollout")
    kept = [(e["name"], e["args"].get("sample")) for e in trace.events()]
    assert trace.stride == 2 and trace.dropped == 0
    assert [n for n, _ in kept] == ["gen", "turn", "tool:add", "turn"] * 2
    assert [s for n, s in kept if n == "gen"] == ["p/0", "p/2"]
