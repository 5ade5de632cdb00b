"""A timeline of every span (generation, reward, sync, training phases) as Chrome/Perfetto JSON.

Open `OUTPUT_DIR/trace.json` in https://ui.perfetto.dev or chrome://tracing: one row per
worker, one box per span, with sample id and policy version in its args. Times come from
`telemetry.clock`: wall-clock in real runs (spans measured in Ray actors line up with the
driver's), virtual time in the simulator. Recording is a list append under a lock; nothing is
written until `export`. Past `max_events` spans are counted, not kept (long simulated runs).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from asyncrl.telemetry import clock
from asyncrl.types import Group


class Trace:
    def __init__(self, enabled: bool = True, max_events: int = 2_000_000) -> None:
        self.enabled = enabled
        self.max_events = max_events
        self.dropped = 0
        self.origin = clock.now()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

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

    def export(self, path: Path) -> None:
        """Write the Chrome trace; worker names become thread rows."""
        events = self.events()
        workers = sorted({e["tid"] for e in events})
        tids = {w: i for i, w in enumerate(workers)}
        out = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[w], "args": {"name": w}}
               for w in workers]
        out += [e | {"tid": tids[e["tid"]]} for e in events]
        path.write_text(json.dumps({"traceEvents": out, "displayTimeUnit": "ms",
                                    "otherData": {"dropped_events": self.dropped}}))
