"""A timeline of every span (generation, reward, sync, training phases) as Chrome/Perfetto JSON.

Open `OUTPUT_DIR/trace.json` in https://ui.perfetto.dev or chrome://tracing: one row per
worker, one box per span, with sample id and policy version in its args. Times come from
`telemetry.clock`: wall-clock in real runs (spans measured in Ray actors line up with the
driver's), virtual time in the simulator. Recording is a list append under a lock; nothing is
written until `export`. Past `max_events` spans are counted, not kept (long simulated runs).

A resumed run appends to the trace.json its earlier segments wrote (see `export`), so the file
holds the whole run's timeline; it does not drop the spans an interrupted run recorded after
its last checkpoint: they are work that happened.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.fsutil import atomic_write_text
from asyncrl.telemetry import clock
from asyncrl.types import Group


@dataclass(frozen=True)
class _Earlier:
    """What an earlier segment of the run left in trace.json: its spans (`tid` = worker name)."""

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

    def now(self) -> float:
        return clock.now()

    def add(self, name: str, worker: str, start: float, end: float, **args: Any) -> None:
        """Record a finished span; start/end are `clock.now()` values."""
        if not self.enabled:
            return
        if len(self._events) >= self.max_events:
            self.dropped += 1
            return
        event = {"name": name, "ph": "X", "pid": 0, "tid": worker,
                 "ts": (start - self.origin) * 1e6, "dur": max(end - start, 0.0) * 1e6,
                 "args": args}
        with self._lock:
            self._events.append(event)

    @contextmanager
    def span(self, name: str, worker: str, **args: Any) -> Iterator[None]:
        start = clock.now()
        try:
            yield
        finally:
            self.add(name, worker, start, clock.now(), **args)

    def add_group(self, group: Group, worker: str) -> None:
        """The spans a rollout host stamped on each trajectory (generation, reward)."""
        if len(self._events) >= self.max_events:
            self.dropped += 2 * len(group.trajectories)
            return
        for t in group.trajectories:
            for phase in ("gen", "reward"):
                start, end = t.timings.get(f"{phase}_start"), t.timings.get(f"{phase}_end")
                if start is not None and end is not None:
                    self.add(phase, f"{worker}/{phase}", start, end, sample=t.request_id,
                             version=t.end_version, tokens=len(t.response_ids))

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def export(self, path: Path, log: Callable[[str], None] = print) -> bool:
        """Write the Chrome trace, worker names as thread rows, after the spans already in `path`.

        Appending: the spans an earlier segment of the run (before a resume) left in `path` come
        first, and this trace's spans are shifted to start where the earlier segment's file time
        axis puts them: by the gap between the two traces' origins (real runs: wall time, so the
        downtime shows) but at least past the last earlier span (the simulator's clock restarts at
        0). The earlier file is read on the first export to `path` only, so exporting twice does
        not repeat its spans. An unreadable or corrupt earlier file is replaced, with a warning.

        The write is atomic (`fsutil.atomic_write_text`): a failed one (a full disk) leaves the
        earlier file as it was. It never raises OSError, since a trace must not fail or mask the
        run's own result: it logs one line and returns False instead.
        """
        if path not in self._earlier:
            self._earlier[path] = _read_earlier(path, log)
        earlier = self._earlier[path]
        events = self.events()
        shift_us, dropped = 0.0, self.dropped
        if earlier is not None:
            gap_s = self.origin - earlier.origin if earlier.origin is not None else 0.0
            shift_us = max(earlier.end_us, gap_s * 1e6)
            events = earlier.spans + [e | {"ts": e["ts"] + shift_us} for e in events]
            dropped += earlier.dropped
        workers = sorted({e["tid"] for e in events})
        tids = {w: i for i, w in enumerate(workers)}
        out = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[w], "args": {"name": w}}
               for w in workers]
        out += [e | {"tid": tids[e["tid"]]} for e in events]
        origin = self.origin - shift_us / 1e6  # the clock reading at the file's ts 0
        text = json.dumps({"traceEvents": out, "displayTimeUnit": "ms",
                           "otherData": {"dropped_events": dropped, "origin_s": origin}})
        try:
            atomic_write_text(path, text)
        except OSError as e:
            log(f"warning: trace not written to {path}: {e}")
            return False
        return True


def _read_earlier(path: Path, log: Callable[[str], None]) -> _Earlier | None:
    """The spans in an existing trace.json written by `export`; None if there is no such file
    (or it is corrupt, which is logged)."""
    try:
        data = json.loads(path.read_text())
        names = {e["tid"]: str(e["args"]["name"]) for e in data["traceEvents"] if e["ph"] == "M"}
        spans = [e | {"tid": names[e["tid"]]} for e in data["traceEvents"] if e["ph"] != "M"]
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
