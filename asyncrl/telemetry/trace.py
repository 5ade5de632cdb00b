"""A timeline of every span (generation, reward, sync, training phases) as Chrome/Perfetto JSON.

Open `OUTPUT_DIR/trace.json` in https://ui.perfetto.dev or chrome://tracing: one row per
worker, one box per span, with sample id and policy version in its args. Times are wall-clock
(`time.time()`), so spans measured in other processes (Ray actors) line up with the driver's.
Recording is a list append under a lock; nothing is written until `export`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from asyncrl.types import Group


class Trace:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.origin = time.time()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.time()

    def add(self, name: str, worker: str, start: float, end: float, **args: Any) -> None:
        """Record a finished span; start/end are `time.time()` values."""
        if not self.enabled:
            return
        event = {"name": name, "ph": "X", "pid": 0, "tid": worker,
                 "ts": (start - self.origin) * 1e6, "dur": max(end - start, 0.0) * 1e6,
                 "args": args}
        with self._lock:
            self._events.append(event)

    @contextmanager
    def span(self, name: str, worker: str, **args: Any) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.add(name, worker, start, time.time(), **args)

    def add_group(self, group: Group, worker: str) -> None:
        """The spans a rollout host stamped on each trajectory (generation, reward)."""
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
        path.write_text(json.dumps({"traceEvents": out, "displayTimeUnit": "ms"}))
