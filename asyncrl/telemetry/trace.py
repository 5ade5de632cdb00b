"""A timeline of every span (generation, reward, sync, training phases) as Chrome/Perfetto JSON.

Open `OUTPUT_DIR/trace.json` in https://ui.perfetto.dev or chrome://tracing. What it shows
(docs/observability.md):
- one process per rollout engine ("rollout0", ...): its generation requests on lanes
  ("rollout0/gen", "rollout0/gen #1", ...: requests decoded together never share a lane), its
  reward batches likewise, and a "running requests" counter;
- "trainer": each update ("train", with the step) split into its stages (old_log_prob, ref,
  values, adv, update_critic, update_actor: the trainer's `timing_s/*`, laid end to end from the
  update's start), and the fully async trainer's waits; "sync": each weight sync;
- "validation": each validation ("validate", with the step); its requests are "val" spans on the
  engines' generation lanes;
- a multi-turn episode's model turns ("turn", with its number and tokens) and tool calls
  ("tool:<name>", with status and seconds) as spans inside its "gen" span, on its lane (the
  `span/...` keys of `Trajectory.timings`, `asyncrl.telemetry.episode_spans`);
- a flow arrow (`ph` "s" -> "f", category "trained") from each trained response's "gen" span to
  the "train" span of the update that used it: the arrow's length is the sample's staleness;
- "pipeline": counters sampled at every logged step (`COUNTERS`: running and waiting requests,
  groups in flight, queue length, staleness).
Times come from `telemetry.clock`: wall-clock in real runs (spans measured in Ray actors line up
with the driver's), virtual time in the simulator. Recording is a list append under a lock;
nothing is laid out or written until `export` (`asyncrl.telemetry.trace_layout`).

Within `max_events` (long simulated runs), every phase span and counter is kept and the
per-sample events (a group's "gen"/"val"/"reward", turn and tool spans and flow arrows) are sampled over the
whole run: the groups numbered 0, s, 2s, ... in the order they are recorded, where the stride s
doubles (dropping every other kept group) each time the budget fills. The export says so in
`otherData.sampling`. Only phase events that find no room are dropped (`dropped_events`).

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
from asyncrl.telemetry.episode_spans import EpisodeSpan, read_spans
from asyncrl.telemetry.trace_layout import (
    PARENT,
    assign_lanes,
    chrome_events,
    flow_events,
    from_chrome,
    running_counters,
)
from asyncrl.types import Group, Trajectory

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
    next_flow_id: int
    """One past its largest flow id: this segment's arrows are numbered from here."""


class Trace:
    def __init__(self, enabled: bool = True, max_events: int = 2_000_000) -> None:
        self.enabled = enabled
        self.max_events = max_events
        self.dropped = 0
        self.origin = clock.now()
        self.stride = 1
        """Per-sample events are kept for every `stride`-th group (doubles when the budget fills)."""
        self.groups = 0
        """Groups recorded by `add_group` (kept or not): the next group's number."""
        self._events: list[dict[str, Any]] = []  # phase spans and counters: all kept while there is room
        self._samples: list[tuple[int, dict[str, Any]]] = []  # (group number, gen/val/reward span)
        self._flows: list[tuple[int, dict[str, Any], dict[str, Any]]] = []  # (group number, gen span, update)
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
        if not self._make_room(1):
            self.dropped += 1
            return None
        event = _event(name, worker, start - self.origin, end - start, args)
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

    def _used(self) -> int:
        return len(self._events) + len(self._samples) + 2 * len(self._flows)

    def _make_room(self, needed: int) -> bool:
        """Whether `needed` more events fit, after thinning the per-sample events (doubling the
        stride) as often as that frees room."""
        while self._used() + needed > self.max_events:
            if not self._samples and not self._flows or self.stride > self.groups:
                return False  # nothing to thin, or only group 0 left
            with self._lock:
                self.stride *= 2
                self._samples = [(g, e) for g, e in self._samples if g % self.stride == 0]
                self._flows = [f for f in self._flows if f[0] % self.stride == 0]
                kept = {id(e) for _, e in self._samples}
                self._batches = {k: e for k, e in self._batches.items() if id(e) in kept}
        return True

    def add_group(self, group: Group, worker: str, step: int | None = None, validation: bool = False) -> None:
        """The spans a rollout host stamped on each trajectory (generation, reward), on the
        engine that produced it (`timings["engine"]`, set by the rollout router): `{worker}{i}`.
        Responses scored in one batch (same engine, start and end) share one reward span.
        `step`: the update that trained the group (a flow arrow from each generation span to
        its "train" span); `validation`: the generation spans are named "val". Kept only for
        every `stride`-th group (see the module docstring)."""
        number, self.groups = self.groups, self.groups + 1
        if not self.enabled or number % self.stride:
            return
        parts = [read_spans(t.timings) for t in group.trajectories]  # an episode's turns and tool calls
        events = sum(4 + len(p) for p in parts)  # at most a gen, a reward, a flow's two and the parts each
        if not self._make_room(events):
            self.dropped += events - 2 * len(group.trajectories)
            return
        if number % self.stride:  # making room doubled the stride past this group
            return
        update = self._updates.get(step) if step is not None else None
        for t, spans in zip(group.trajectories, parts):
            engine = t.timings.get("engine")
            where = f"{worker}{int(engine)}" if engine is not None else worker
            gen = self._gen_span(number, t, "val" if validation else "gen", f"{where}/gen")
            if gen is not None and update is not None:
                self._flows.append((number, gen, update))
            if gen is not None:
                self._episode_parts(number, gen, spans)
            start, end = t.timings.get("reward_start"), t.timings.get("reward_end")
            if start is not None and end is not None:
                self._reward(number, f"{where}/reward", start, end, t.request_id)

    def _gen_span(self, number: int, t: Trajectory, name: str, worker: str) -> dict[str, Any] | None:
        start, end = t.timings.get("gen_start"), t.timings.get("gen_end")
        if start is None or end is None:
            return None
        event = _event(name, worker, start - self.origin, end - start,
                       {"sample": t.request_id, "version": t.end_version, "tokens": len(t.response_ids)})
        self._samples.append((number, event))
        return event

    def _episode_parts(self, number: int, gen: dict[str, Any], spans: list[EpisodeSpan]) -> None:
        """An episode's turn and tool spans as children of its "gen" span (so on its lane), cut
        to it: an earlier segment's (before a resume) fall outside and are left out. Ordered by
        start, longest first, so that tool calls run at once (one start) nest."""
        lo, hi = gen["ts"], gen["ts"] + gen["dur"]
        for s in sorted(spans, key=lambda s: (s.start, s.start - s.end)):
            start, end = max((s.start - self.origin) * 1e6, lo), min((s.end - self.origin) * 1e6, hi)
            if end >= start:
                event = _event(s.name, gen["tid"], start / 1e6, (end - start) / 1e6, dict(s.args))
                self._samples.append((number, event | {PARENT: gen}))

    def _reward(self, number: int, worker: str, start: float, end: float, sample: str) -> None:
        batch = self._batches.get((worker, start, end))
        if batch is not None:
            batch["args"]["responses"] += 1
            return
        event = _event("reward", worker, start - self.origin, end - start, {"sample": sample, "responses": 1})
        self._samples.append((number, event))  # kept with the group that opened the batch
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
        room = len(samples) if self._make_room(len(samples)) else max(self.max_events - self._used(), 0)
        with self._lock:
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
        """The spans and counters kept: phase events, then the sampled per-sample spans."""
        with self._lock:
            return self._events + [e for _, e in self._samples]

    def sampling(self) -> dict[str, Any]:
        """What `otherData.sampling` says: which per-sample events were kept."""
        kept = len({g for g, _ in self._samples})
        return {"kept": "every phase span and counter; per-sample spans (gen, val, reward, an episode's turns "
                        "and tool calls) and flow arrows "
                        "of every stride-th group, in the order recorded",
                "stride": self.stride, "groups": self.groups, "groups_kept": kept,
                "running_requests": "from the kept spans" if self.stride == 1 else "omitted: sampled spans"}

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
        events = self._laid_out(earlier.next_flow_id if earlier is not None else 0)
        shift_us, dropped = 0.0, self.dropped
        if earlier is not None:
            gap_s = self.origin - earlier.origin if earlier.origin is not None else 0.0
            shift_us = max(earlier.end_us, gap_s * 1e6)
            events = earlier.spans + [e | {"ts": e["ts"] + shift_us} for e in events]
            dropped += earlier.dropped
        origin = self.origin - shift_us / 1e6  # the clock reading at the file's ts 0
        text = json.dumps({"traceEvents": chrome_events(events), "displayTimeUnit": "ms",
                           "otherData": {"dropped_events": dropped, "origin_s": origin,
                                         "sampling": self.sampling()}})
        try:
            atomic_write_text(path, text)
        except OSError as e:
            log(f"warning: trace not written to {path}: {e}")
            return False
        return True


    def _laid_out(self, first_flow_id: int) -> list[dict[str, Any]]:
        """The kept events on their lanes, the engines' running counters (unless sampled) and
        the flow arrows between the laid-out spans, numbered from `first_flow_id`."""
        with self._lock:
            recorded = self._events + [e for _, e in self._samples]
            flows = [(gen, update) for _, gen, update in self._flows]
        events = assign_lanes(recorded)
        laid = {id(r): e for r, e in zip(recorded, events)}
        if self.stride == 1:  # from the top-level spans: an episode's turns are not requests of their own
            events += running_counters([laid[id(r)] for r in recorded if PARENT not in r])
        pairs = [(laid[id(g)], laid[id(u)]) for g, u in flows if id(g) in laid and id(u) in laid]
        return events + flow_events(pairs, first_flow_id)


def _event(name: str, worker: str, start_s: float, seconds: float, args: dict[str, Any]) -> dict[str, Any]:
    """A complete span `start_s` seconds after the trace's origin, on thread `worker`."""
    return {"name": name, "ph": "X", "tid": worker, "ts": start_s * 1e6, "dur": max(seconds, 0.0) * 1e6, "args": args}


def _read_earlier(path: Path, log: Callable[[str], None]) -> _Earlier | None:
    """The events in an existing trace.json written by `export`; None if there is no such file
    (or it is corrupt, which is logged)."""
    try:
        data = json.loads(path.read_text())
        spans = from_chrome(data["traceEvents"])
        end_us = max((float(e["ts"]) + float(e.get("dur", 0.0)) for e in spans), default=0.0)
        other = data.get("otherData", {})
        origin = other.get("origin_s")
        next_flow = max((int(e["id"]) + 1 for e in spans if e["ph"] in ("s", "f")), default=0)
        return _Earlier(spans, end_us, float(origin) if origin is not None else None,
                        int(other.get("dropped_events", 0)), next_flow)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log(f"warning: {path} is not a readable trace ({type(e).__name__}: {e}); replacing it")
        return None
