"""trace.json of real runs (tiny model, 2 steps): valid for Perfetto (no two complete events on
one thread overlap unless one nests in the other, as a training stage in its update; generation
requests never share a lane), the update split into its stages, the counter tracks, validation
spans and an arrow from each trained response to its update."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.pipelines.helpers import run_pipeline

COMMON = ("data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.max_response_length=8",
          "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0", "actor.use_kl_loss=true",
          "rollout.num_engines=2")


def load(path: Path) -> tuple[list[dict], dict[tuple[int, int], str], dict[int, str]]:
    events = json.loads(path.read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    return events, threads, processes


def assert_perfetto_valid(events: list[dict], threads: dict[tuple[int, int], str]) -> None:
    by_track: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in threads, e
            by_track[(e["pid"], e["tid"])].append(e)
    eps = 1e-3  # µs: float rounding of stages laid end to end
    for track, spans in by_track.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[float] = []
        for e in spans:
            while open_ends and open_ends[-1] <= e["ts"] + eps:
                open_ends.pop()
            if open_ends:  # overlaps an open span: only a nested stage may
                assert e["ts"] + e["dur"] <= open_ends[-1] + eps, (threads[track], e)
                assert "/gen" not in threads[track], "two generation requests on one lane"
            open_ends.append(e["ts"] + e["dur"])


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["colocated", "fully_async"])
def test_trace_of_a_real_run(tiny_cache: Path, tmp_path: Path, pipeline: str) -> None:
    extra = ("async_training.trigger_parameter_sync_step=1", "async_training.require_batches=1") \
        if pipeline == "fully_async" else ("actor.old_log_probs=recompute",)  # the pass, so its span is traced
    run_pipeline(tmp_path, f"pipeline={pipeline}", *COMMON, *extra)
    events, threads, processes = load(tmp_path / "trace.json")
    assert_perfetto_valid(events, threads)
    names = {(processes[e["pid"]], e["name"]) for e in events if e["ph"] in "XC"}
    stages_run = ("train", "ref", "adv", "update_actor") + (("old_log_prob",) if pipeline == "colocated" else ())
    for stage in stages_run:  # fully async trains on the rollout's log-probs: no old_log_prob pass
        assert ("trainer", stage) in names
    assert ("sync", "sync") in names
    assert {("rollout0", "gen"), ("rollout1", "gen"), ("rollout0", "running requests")} <= names
    assert any(p.startswith("rollout") and n == "reward" for p, n in names)
    gen_lanes = {threads[(e["pid"], e["tid"])] for e in events if e["ph"] == "X" and e["name"] == "gen"}
    assert "rollout0/gen #1" in gen_lanes, "concurrent requests go to separate lanes"
    counters = {n for p, n in names if p == "pipeline"}
    assert "rollouter/running" in counters
    if pipeline == "fully_async":
        assert {"fully_async/queue/size", "staleness/version_lag_mean"} <= counters
    train = [e for e in events if e["ph"] == "X" and e["name"] == "train"]
    stages = [e for e in events if e["ph"] == "X" and e["name"] in stages_run[1:]]
    assert len(train) == 2 and len(stages) == 2 * len(stages_run[1:])
    for s in stages:  # inside one update, on its track
        assert any(t["tid"] == s["tid"] and t["ts"] - 1e-3 <= s["ts"] <= s["ts"] + s["dur"] <= t["ts"] + t["dur"] + 1e-3
                   for t in train)
    assert ("validation", "validate") in names and any(p.startswith("rollout") and n == "val" for p, n in names)
    arrives = [e for e in events if e["ph"] == "f"]  # one arrow per trained response, into its update
    assert len(arrives) == 2 * 4 * 4 and all(any(t["tid"] == e["tid"] and t["ts"] <= e["ts"] <= t["ts"] + t["dur"]
                                                 for t in train) for e in arrives)
