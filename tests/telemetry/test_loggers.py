"""Metric sinks write what a user opens: JSONL lines and TensorBoard event files."""

from __future__ import annotations

import json

from asyncrl.telemetry.loggers import make_tracker
from asyncrl.telemetry.trace import Trace


def test_jsonl_and_tensorboard(tmp_path):
    tracker = make_tracker(["jsonl", "tensorboard"], tmp_path, total_steps=2, initial_step=0,
                           project="p", experiment="e", config={})
    tracker.log({"critic/score/mean": 0.5, "timing_s/step": 1.0}, 1)
    tracker.log({"critic/score/mean": float("nan")}, 2)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.0},
                    {"step": 2, "critic/score/mean": None}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_trace_export(tmp_path):
    trace = Trace()
    with trace.span("train", "trainer", step=1):
        pass
    trace.add("gen", "rollout/gen", trace.now(), trace.now() + 0.5, sample="p/0", version=3)
    trace.export(tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in spans} == {"train", "gen"}
    gen = next(e for e in spans if e["name"] == "gen")
    assert gen["args"] == {"sample": "p/0", "version": 3} and abs(gen["dur"] - 5e5) < 1e3
