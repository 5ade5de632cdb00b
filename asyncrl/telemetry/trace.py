"""A timeline of every span (generation, reward, sync, training phases) as Chrome/Perfetto JSON.

Open `OUTPUT_DIR/trace.json` in https://ui.perfetto.dev or chrome://tracing. What it shows
(docs/observability.md):
- one process per rollout engine ("rollout0", ...): its generation requests on lanes
  ("rollout0/gen", "rollout0/gen #1", ...: requests decoded together never share a lane), its
  reward batches likewise, and a "running requests" counter;
- "trainer": each update ("train", with the step) split into its stages (old_log_prob, ref,
  values, adv, update_critic, update_actor: the trainer's `timing_s/*`, laid end to end from the
  update's start), and the fully async trainer's waits; "sync": each weight sync;
- "pipeline": counters sampled at every logged step (`COUNTERS`: running and waiting requests,
  groups in flight, queue length, staleness).
Times come from `telemetry.clock`: wall-clock in real runs (spans measured in Ray actors line up
with the driver's), virtual time in the simulator. Recording is a list append under a lock;
nothing is laid out or written until `export` (`asyncrl.telemetry.trace_layout`). Past
`max_events` spans are counted, not kept (long simulated runs).

A resumed run appends to the trace.json its earlier segments wrote (see `export`), so the file
holds the whole run's timeline; it does not drop the spans an interrupted run recorded after
its last checkpoint: they are work that happened.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.fsutil import atomic_write_text
from asyncrl.telemetry import clock
from asyncrl.telemetry.trace_layout import PARENT, assign_lanes, chrome_events, from_chrome, running_counters
from asyncrl.types import Group

TRAIN_STAGES = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
"""The trainer's timed stages (`asyncrl.workers.trainer`), in the order they run in an update."""
COUNTERS = ("rollouter/running", "rollouter/waiting", "rollouter/in_flight", "fully_async/queue/size",
            "staleness/version_lag_mean", "staleness/version_lag_max")
"""Step metrics drawn as counter tracks of the "pipeline" process, when a pipeline logs them."""


@dataclass(frozen=True)
class _Earlier:
    """What an earlier segment of the run left in trace.json: its events (`tid` = thread name)."""

    spans: list[dict[str, Any]]
    end_us: float
    """Where the last span ends, in the file's microseconds."""
    origin: float | None
    """Its trace's `origin` (`clock.now()` seconds), if recorded."""
    dropped: int


class Trace:
    def __init__(self, enabled: bool = True, max_events: int = 2_000_000) -> None:
        self.enabled = enabled
        self.max_events = max_events
        self.dropped = 0
        self.origin = clock.now()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._earlier: dict[Path, _Earlier | None] = {}  # read once per path: exports are idempotent
        self._updates: dict[int, dict[str, Any]] = {}  # step -> its "train" span, split by `log_step`
        self._batches: dict[tuple[str, float, float], dict[str, Any]] = {}  # reward batches, one span each

    def now(self) -> float:
        return clock.now()

    def add(self, name: str, worker: str, start: float, end: float, **args: Any) -> None:
        """Record a finished span; start/end are `clock.now()` values."""
        event = self._span(name, worker, start, end, args)
        if event is not None and name == "train" and isinstance(args.get("step"), int):
            self._updates[args["step"]] = event

    def _span(self, name: str, worker: str, start: float, end: float, args: dict[str, Any],
              parent: dict[str, Any] | None = None) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        if len(self._events) >= self.max_events:
            self.dropped += 1
            return None
        event = {"name": name, "ph": "X", "tid": worker, "ts": (start - self.origin) * 1e6,
                 "dur": max(end - start, 0.0) * 1e6, "args": args}
        if parent is not None:
            event[PARENT] = parent
        with self._lock:
            self._events.append(event)
        return event

    @contextmanager
    def span(self, name: str, worker: str, **args: Any) -> Iterator[None]:
        start = clock.now()
        try:
            yield
        finally:
            self.add(name, worker, start, clock.now(), **args)

    def add_group(self, group: Group, worker: str) -> None:
        """The spans a rollout host stamped on each trajectory (generation, reward), on the
        engine that produced it (`timings["engine"]`, set by the rollout router): `{worker}{i}`.
        Responses scored in one batch (same engine, start and end) share one reward span."""
        if len(self._events) >= self.max_events:
            self.dropped += 2 * len(group.trajectories)
            return
        for t in group.trajectories:
            engine = t.timings.get("engine")
            where = f"{worker}{int(engine)}" if engine is not None else worker
            for phase in ("gen", "reward"):
                start, end = t.timings.get(f"{phase}_start"), t.timings.get(f"{phase}_end")
                if start is None or end is None:
                    continue
                if phase == "gen":
                    self.add(phase, f"{where}/gen", start, end, sample=t.request_id, version=t.end_version,
                             tokens=len(t.response_ids))
                else:
                    self._reward(f"{where}/reward", start, end, t.request_id)

    def _reward(self, worker: str, start: float, end: float, sample: str) -> None:
        batch = self._batches.get((worker, start, end))
        if batch is not None:
            batch["args"]["responses"] += 1
            return
        event = self._span("reward", worker, start, end, {"sample": sample, "responses": 1})
        if event is not None:
            self._batches[(worker, start, end)] = event

    def log_step(self, metrics: Mapping[str, float], step: int) -> None:
        """A logged step: its update's stages as child spans of its "train" span (the trainer's
        `timing_s/<stage>`, end to end from the update's start, scaled down if they add up to
        more than the span, as the stream trainer's do), and `COUNTERS` samples at this instant."""
        parent = self._updates.pop(step, None)
        if parent is not None:
            self._split(parent, metrics)
        ts = (clock.now() - self.origin) * 1e6
        samples = [{"name": k, "ph": "C", "proc": "pipeline", "ts": ts, "args": {"value": float(metrics[k])}}
                   for k in COUNTERS if k in metrics]
        if not self.enabled:
            return
        with self._lock:
            room = max(self.max_events - len(self._events), 0)
            self._events += samples[:room]
            self.dropped += len(samples[room:])

    def _split(self, parent: dict[str, Any], metrics: Mapping[str, float]) -> None:
        stages = [(s, float(metrics[f"timing_s/{s}"])) for s in TRAIN_STAGES if f"timing_s/{s}" in metrics]
        total_s = sum(d for _, d in stages)
        scale = min(1.0, parent["dur"] / 1e6 / total_s) if total_s > 0 else 1.0
        at = self.origin + parent["ts"] / 1e6
        for stage, seconds in stages:
            self._span(stage, parent["tid"], at, at + seconds * scale, {"seconds": seconds}, parent=parent)
            at += seconds * scale

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def export(self, path: Path, log: Callable[[str], None] = print) -> bool:
        """Write the Chrome trace (laid out by `trace_layout`) after the events already in `path`.

        Appending: the events an earlier segment of the run (before a resume) left in `path` come
        first, and this trace's are shifted to start where the earlier segment's file time
        axis puts them: by the gap between the two traces' origins (real runs: wall time, so the
        downtime shows) but at least past the last earlier span (the simulator's clock restarts at
        0). The earlier file is read on the first export to `path` only, so exporting twice does
        not repeat its events. An unreadable or corrupt earlier file is replaced, with a warning.

        The write is atomic (`fsutil.atomic_write_text`): a failed one (a full disk) leaves the
        earlier file as it was. It never raises OSError, since a trace must not fail or mask the
        run's own result: it logs one line and returns False instead.
        """
        if path not in self._earlier:
            self._earlier[path] = _read_earlier(path, log)
        earlier = self._earlier[path]
        events = assign_lanes(self.events())
        events += running_counters(events)
        shift_us, dropped = 0.0, self.dropped
        if earlier is not None:
            gap_s = self.origin - earlier.origin if earlier.origin is not None else 0.0
            shift_us = max(earlier.end_us, gap_s * 1e6)
            events = earlier.spans + [e | {"ts": e["ts"] + shift_us} for e in events]
            dropped += earlier.dropped
        origin = self.origin - shift_us / 1e6  # the clock reading at the file's ts 0
        text = json.dumps({"traceEvents": chrome_events(events), "displayTimeUnit": "ms",
                           "otherData": {"dropped_events": dropped, "origin_s": origin}})
        try:
            atomic_write_text(path, text)
        except OSError as e:
            log(f"warning: trace not written to {path}: {e}")
            return False
        return True


def _read_earlier(path: Path, log: Callable[[str], None]) -> _Earlier | None:
    """The events in an existing trace.json written by `export`; None if there is no such file
    (or it is corrupt, which is logged)."""
    try:
        data = json.loads(path.read_text())
        spans = from_chrome(data["traceEvents"])
        end_us = max((float(e["ts"]) + float(e.get("dur", 0.0)) for e in spans), default=0.0)
        other = data.get("otherData", {})
        origin = other.get("origin_s")
        return _Earlier(spans, end_us, float(origin) if origin is not None else None,
                        int(other.get("dropped_events", 0)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log(f"warning: {path} is not a readable trace ({type(e).__name__}: {e}); replacing it")
        return None
