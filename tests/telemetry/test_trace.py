"""trace.json: spans as Chrome trace events; a resumed run appends its spans after the earlier
segment's, and a failed write (a full disk) leaves the earlier file whole."""

from __future__ import annotations

import errno
import json
import os

import pytest

from asyncrl.telemetry.clock import use_clock
from asyncrl.telemetry.trace import Trace


class ManualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def spans(path):
    """(name, worker, ts, dur) of each span in the file, in file order."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    return [(e["name"], names[e["tid"]], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]


def segment(path, start, spans_s, dropped=0, log=print):
    """A run segment whose trace starts at clock reading `start` and records (name, worker, from, to)."""
    with use_clock(ManualClock(start)):
        trace = Trace()
    trace.dropped = dropped
    for name, worker, t0, t1 in spans_s:
        trace.add(name, worker, start + t0, start + t1)
    return trace.export(path, log=log)


def test_trace_export(tmp_path):
    trace = Trace()
    with trace.span("train", "trainer", step=1):
        pass
    trace.add("gen", "rollout/gen", trace.now(), trace.now() + 0.5, sample="p/0", version=3)
    assert trace.export(tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in x} == {"train", "gen"}
    gen = next(e for e in x if e["name"] == "gen")
    assert gen["args"] == {"sample": "p/0", "version": 3} and abs(gen["dur"] - 5e5) < 1e3


def test_resumed_run_appends_after_the_earlier_spans(tmp_path):
    path = tmp_path / "trace.json"
    segment(path, 0.0, [("gen", "rollout", 0.0, 1.0), ("train", "trainer", 1.0, 3.0)], dropped=2)
    # The simulator's clock restarts at 0 on resume: the new spans go after the last earlier one.
    segment(path, 0.0, [("train", "trainer", 0.0, 0.5), ("sync", "syncer", 0.5, 1.0)], dropped=1)
    assert spans(path) == [("gen", "rollout", 0.0, 1e6), ("train", "trainer", 1e6, 2e6),
                           ("train", "trainer", 3e6, 0.5e6), ("sync", "syncer", 3.5e6, 0.5e6)]
    assert json.loads(path.read_text())["otherData"]["dropped_events"] == 3
    segment(path, 0.0, [("gen", "rollout", 0.0, 1.0)])
    assert spans(path)[-1] == ("gen", "rollout", 4e6, 1e6)


def test_wall_clock_gap_between_segments_is_kept(tmp_path):
    path = tmp_path / "trace.json"
    segment(path, 1000.0, [("train", "trainer", 0.0, 1.0)])
    segment(path, 1100.0, [("train", "trainer", 0.0, 1.0)])
    segment(path, 1100.5, [("train", "trainer", 0.0, 1.0)])  # overlaps the previous: placed after it
    assert [s[2] for s in spans(path)] == [0.0, 100e6, 101e6]


def test_exporting_twice_does_not_duplicate(tmp_path):
    path = tmp_path / "trace.json"
    segment(path, 0.0, [("gen", "rollout", 0.0, 1.0)])
    with use_clock(ManualClock(0.0)):
        trace = Trace()
    trace.add("train", "trainer", 0.0, 1.0)
    trace.export(path)
    trace.add("train", "trainer", 1.0, 2.0)
    trace.export(path)
    assert [(s[0], s[2]) for s in spans(path)] == [("gen", 0.0), ("train", 1e6), ("train", 2e6)]


@pytest.mark.parametrize("content", ["", '{"traceEvents": [{"ph": "X"', "[1, 2]", '{"traceEvents": [7]}'])
def test_corrupt_earlier_trace_is_replaced_with_a_warning(tmp_path, content):
    path = tmp_path / "trace.json"
    path.write_text(content)
    lines: list[str] = []
    assert segment(path, 0.0, [("gen", "rollout", 0.0, 1.0)], log=lines.append)
    assert spans(path) == [("gen", "rollout", 0.0, 1e6)]
    assert len(lines) == 1 and "not a readable trace" in lines[0]


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_failed_write_leaves_the_earlier_trace_whole(tmp_path, monkeypatch, failing):
    path = tmp_path / "trace.json"
    segment(path, 0.0, [("gen", "rollout", 0.0, 1.0)])
    before = path.read_bytes()

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, disk_full)
    lines: list[str] = []
    assert not segment(path, 0.0, [("train", "trainer", 0.0, 1.0)], log=lines.append)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["trace.json"]
    assert len(lines) == 1 and "No space left on device" in lines[0]


def threads_of(path):
    """{span name: [thread name, ...]} in file order, and the counters as (process, name, ts, value)."""
    events = json.loads(path.read_text())["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    by_name: dict[str, list[str]] = {}
    for e in events:
        if e["ph"] == "X":
            by_name.setdefault(e["name"], []).append(threads[e["tid"]])
    counters = [(procs[e["pid"]], e["name"], e["ts"], e["args"]["value"]) for e in events if e["ph"] == "C"]
    return by_name, counters


def test_overlapping_requests_go_to_the_lowest_free_lane(tmp_path):
    with use_clock(ManualClock(0.0)):
        trace = Trace()
    # engine 0: a [0, 4), b [1, 2), c [2, 5) (b's lane is free again at 2), d [4, 6) (a's lane free)
    for start, end in [(0, 4), (1, 2), (2, 5), (4, 6)]:
        trace.add("gen", "rollout0/gen", start, end)
    trace.add("gen", "rollout1/gen", 1, 3)
    trace.export(tmp_path / "t.json")
    by_name, counters = threads_of(tmp_path / "t.json")
    assert by_name["gen"] == ["rollout0/gen", "rollout0/gen #1", "rollout0/gen #1", "rollout0/gen", "rollout1/gen"]
    running = [(ts / 1e6, v) for p, n, ts, v in counters if p == "rollout0" and n == "running requests"]
    assert running == [(0, 1), (1, 2), (2, 2), (4, 2), (5, 1), (6, 0)]


def test_a_logged_step_splits_its_update_into_stages_and_samples_counters(tmp_path):
    clock = ManualClock(0.0)
    with use_clock(clock):
        trace = Trace()
        trace.add("train", "trainer", 10.0, 14.0, step=3)
        clock.t = 20.0
        # the stages add up to 8 s, twice the update's 4 s: laid end to end at half their length
        trace.log_step({"timing_s/old_log_prob": 2.0, "timing_s/adv": 2.0, "timing_s/update_actor": 4.0,
                        "timing_s/gen": 9.0, "rollouter/running": 5, "fully_async/queue/size": 2}, step=3)
    trace.export(tmp_path / "t.json")
    assert [s for s in spans(tmp_path / "t.json")] == [
        ("train", "trainer", 10e6, 4e6), ("old_log_prob", "trainer", 10e6, 1e6), ("adv", "trainer", 11e6, 1e6),
        ("update_actor", "trainer", 12e6, 2e6)]
    _, counters = threads_of(tmp_path / "t.json")
    assert counters == [("pipeline", "rollouter/running", 20e6, 5.0), ("pipeline", "fully_async/queue/size", 20e6, 2.0)]


def test_responses_scored_in_one_batch_share_a_reward_span(tmp_path):
    from asyncrl.types import Group, PromptRow, Trajectory

    def traj(i: int, gen: tuple[float, float]) -> Trajectory:
        timings = {"gen_start": gen[0], "gen_end": gen[1], "reward_start": 5.0, "reward_end": 6.0, "engine": 1}
        return Trajectory(f"p/{i}", [1], [2, 3], [0.0, 0.0], [0, 0], "stop", timings=timings)

    with use_clock(ManualClock(0.0)):
        trace = Trace()
    row = PromptRow(uid="p", data_source="s", messages=(), ground_truth="a", prompt_ids=(1,))
    trace.add_group(Group("p", row, [traj(0, (0.0, 2.0)), traj(1, (1.0, 4.0)), traj(2, (2.0, 3.0))]), "rollout")
    trace.export(tmp_path / "t.json")
    by_name, _ = threads_of(tmp_path / "t.json")
    assert by_name == {"gen": ["rollout1/gen", "rollout1/gen #1", "rollout1/gen"], "reward": ["rollout1/reward"]}
    reward = next(e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["name"] == "reward")
    assert reward["args"]["responses"] == 3


def test_counters_count_against_max_events(tmp_path):
    with use_clock(ManualClock(0.0)):
        trace = Trace(max_events=3)
        trace.add("train", "trainer", 0.0, 1.0)
        trace.log_step({"rollouter/running": 1, "rollouter/waiting": 2, "fully_async/queue/size": 3}, step=1)
    assert len(trace.events()) == 3 and trace.dropped == 1


def traj_at(i: int, gen: tuple[float, float], reward: tuple[float, float] | None = None):
    from asyncrl.types import Trajectory

    timings = {"gen_start": gen[0], "gen_end": gen[1], "engine": 0}
    if reward is not None:
        timings |= {"reward_start": reward[0], "reward_end": reward[1]}
    return Trajectory(f"p{i}/0", [1], [2, 3], [0.0, 0.0], [0, 0], "stop", timings=timings)


def one_group(i: int, gen: tuple[float, float], reward: tuple[float, float] | None = None):
    from asyncrl.types import Group, PromptRow

    row = PromptRow(uid=f"p{i}", data_source="s", messages=(), ground_truth="a", prompt_ids=(1,))
    return Group(f"p{i}@1", row, [traj_at(i, gen, reward)])


def test_a_flow_arrow_goes_from_each_trained_generation_to_its_update(tmp_path):
    """Flow events "s" -> "f" with one id: "s" inside the gen span on its lane, "f" inside the
    update's "train" span on the trainer's thread, bound to it ("bp": "e"); validation groups
    get "val" spans and no arrow; a resumed segment numbers its arrows after the earlier ones."""
    path = tmp_path / "t.json"
    with use_clock(ManualClock(0.0)):
        trace = Trace()
        trace.add("validate", "validation", 0.0, 1.0, step=0)
        trace.add_group(one_group(9, (0.0, 1.0)), "rollout", validation=True)
        trace.add("train", "trainer", 5.0, 7.0, step=1)
        trace.add_group(one_group(0, (1.0, 3.0)), "rollout", step=1)
        trace.add_group(one_group(1, (2.0, 4.0)), "rollout", step=1)
        trace.export(path)
    events = json.loads(path.read_text())["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans_by = {(e["name"], e["args"].get("sample")): e for e in events if e["ph"] == "X"}
    flows = [e for e in events if e["ph"] in "sf"]
    assert sorted((e["ph"], e["id"]) for e in flows) == [("f", 0), ("f", 1), ("s", 0), ("s", 1)]
    train = spans_by[("train", None)]
    for e in flows:
        assert e["cat"] == "trained"
        if e["ph"] == "s":
            gen = next(s for s in spans_by.values() if s["name"] == "gen" and s["ts"] < e["ts"] < s["ts"] + s["dur"]
                       and s["tid"] == e["tid"])
            assert threads[gen["tid"]].startswith("rollout0/gen")
        else:
            assert e["bp"] == "e" and e["tid"] == train["tid"] and train["ts"] < e["ts"] < train["ts"] + train["dur"]
    assert threads[spans_by[("validate", None)]["tid"]] == "validation"
    assert threads[spans_by[("val", "p9/0")]["tid"]] == "rollout0/gen"
    with use_clock(ManualClock(0.0)):
        again = Trace()
        again.add("train", "trainer", 1.0, 2.0, step=2)
        again.add_group(one_group(2, (0.0, 1.0)), "rollout", step=2)
        again.export(path)
    ids = [(e["ph"], e["id"]) for e in json.loads(path.read_text())["traceEvents"] if e["ph"] in "sf"]
    assert sorted(ids) == [("f", 0), ("f", 1), ("f", 2), ("s", 0), ("s", 1), ("s", 2)]


def test_per_sample_spans_are_sampled_over_the_whole_run_within_the_budget(tmp_path):
    """100 steps of one update span and 4 one-response groups each (a gen span, a reward span and
    an arrow's two events: 4 events a group), in a budget of 200 events: the 100 updates are all
    kept, leaving room for 25 groups, so the stride doubles to 16 (400 / 8 = 50 groups would not
    fit) and groups 0, 16, ..., 384 are kept: step 1's first group to step 97's."""
    with use_clock(ManualClock(0.0)):
        trace = Trace(max_events=200)
        for step in range(1, 101):
            t = 10.0 * step
            trace.add("train", "trainer", t + 5, t + 6, step=step)
            for j in range(4):
                trace.add_group(one_group(4 * step + j, (t, t + 1), (t + 1 + j / 10, t + 2)), "rollout", step=step)
        trace.export(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    events = data["traceEvents"]
    assert sum(e["name"] == "train" for e in events) == 100 and data["otherData"]["dropped_events"] == 0
    sampling = data["otherData"]["sampling"]
    assert (sampling["stride"], sampling["groups"], sampling["groups_kept"]) == (16, 400, 25)
    gens = sorted(e["ts"] for e in events if e["name"] == "gen")
    assert len(gens) == 25 and gens[0] == 10e6 and gens[-1] == 970e6
    assert sum(e["ph"] != "M" for e in events) == 200
    assert not any(e["name"] == "running requests" for e in events)  # it would count only the kept spans
