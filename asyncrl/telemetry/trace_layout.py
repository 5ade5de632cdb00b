"""Where trace.json draws each span: lanes for overlapping work, one process per worker group.

`Trace` records spans by worker name ("rollout0/gen", "trainer", "sync"); Perfetto and
chrome://tracing need complete events (`ph: X`) on one thread either disjoint or nested, so
this module lays them out when the trace is written:

- `assign_lanes`: the top-level spans of one worker that overlap (the requests an engine decodes
  together) go to the lowest free lane, threads "rollout0/gen", "rollout0/gen #1", ...; no two
  spans on a lane overlap. Child spans (the phases of a training step) stay on their parent's.
- `running_counters`: per engine, a counter track of the requests in flight, from the same spans.
- `flow_events`: a flow arrow (Chrome's `ph` "s" -> "f") between two laid-out spans, each end
  inside its span so that viewers bind it to that slice.
- `chrome_events`: numeric pids (one process per name prefix before "/": an engine, the trainer,
  the validation, the sync, the pipeline's counters) and tids, with their name and sort-order metadata.

It does not record anything or read clocks (`asyncrl.telemetry.trace` does).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any

Event = dict[str, Any]
LANE_SEP = " #"
PARENT = "_parent"
"""Key of a child span's parent event (dropped on export)."""
PROCESS_ORDER = ("trainer", "validation", "sync", "pipeline")
"""Processes shown first, in this order; the rest (engines) follow by name."""


def process_of(event: Event) -> str:
    """A span's process: its worker name up to the first "/"; a counter names its own."""
    return str(event["proc"]) if event["ph"] == "C" else str(event["tid"]).split("/")[0]


def assign_lanes(events: list[Event]) -> list[Event]:
    """Copies of `events` with each top-level span's `tid` set to its lane and each child's to
    its parent's lane; `PARENT` links removed."""
    lane_of: dict[int, str] = {}
    by_worker: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and PARENT not in e:
            by_worker[e["tid"]].append(e)
    for worker, spans in by_worker.items():
        for e, lane in zip(spans, _lanes(spans)):
            lane_of[id(e)] = worker if lane == 0 else f"{worker}{LANE_SEP}{lane}"
    out = []
    for e in events:
        parent = e.get(PARENT)
        tid = lane_of.get(id(parent if parent is not None else e), e.get("tid"))
        out.append({k: v for k, v in e.items() if k != PARENT} | ({"tid": tid} if e["ph"] == "X" else {}))
    return out


def _lanes(spans: list[Event]) -> list[int]:
    """The lowest lane free at each span's start (a lane is free once its last span ended)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts"], -spans[i]["dur"]))
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    lanes = [0] * len(spans)
    for i in order:
        start = spans[i]["ts"]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (start + spans[i]["dur"], lane))
        lanes[i] = lane
    return lanes


def running_counters(events: list[Event]) -> list[Event]:
    """Per engine (worker "<engine>/gen"), a "running requests" counter: +1 at each generation
    span's start, -1 at its end."""
    deltas: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e["ph"] == "X" and PARENT not in e and str(e["tid"]).partition(LANE_SEP)[0].endswith("/gen"):
            d = deltas[process_of(e)]
            d[e["ts"]] += 1
            d[e["ts"] + e["dur"]] -= 1
    out = []
    for proc, d in deltas.items():
        running = 0
        for ts in sorted(d):
            running += d[ts]
            out.append({"name": "running requests", "ph": "C", "proc": proc, "ts": ts, "args": {"value": running}})
    return out


FLOW_CATEGORY = "trained"
"""Category of the arrows from a sample's generation to the update that trained it."""
ON_THREAD = ("X", "s", "f")
"""Event phases drawn on a thread (the rest: counters, on their process)."""


def flow_events(pairs: list[tuple[Event, Event]], first_id: int = 0) -> list[Event]:
    """An arrow per (from span, to span), ids from `first_id`. Each end lies inside its span, 1 µs
    (or half the span) from the edge it leaves or enters, so the slice that encloses it (what
    Chrome and Perfetto bind a flow event to) is that span, not a neighbour that ends or starts
    at the same instant; "f" binds to its enclosing slice ("bp": "e")."""
    out: list[Event] = []
    for i, (src, dst) in enumerate(pairs, start=first_id):
        out += [{"name": "sample", "cat": FLOW_CATEGORY, "ph": "s", "id": i, "tid": src["tid"],
                 "ts": src["ts"] + src["dur"] - min(1.0, src["dur"] / 2)},
                {"name": "sample", "cat": FLOW_CATEGORY, "ph": "f", "bp": "e", "id": i, "tid": dst["tid"],
                 "ts": dst["ts"] + min(1.0, dst["dur"] / 2)}]
    return out


def chrome_events(events: list[Event]) -> list[Event]:
    """`events` (tid: thread name, proc: counter's process) with numeric pids and tids, after
    process_name, thread_name and sort-index metadata."""
    processes = sorted({process_of(e) for e in events}, key=_process_key)
    pids = {p: i for i, p in enumerate(processes)}
    threads = sorted({e["tid"] for e in events if e["ph"] == "X"}, key=_thread_key)
    tids = {t: i for i, t in enumerate(threads)}
    meta: list[Event] = []
    for p, pid in pids.items():
        meta += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": p}},
                 {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for t, tid in tids.items():
        pid = pids[t.split("/")[0]]
        meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": t}},
                 {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    body = []
    for e in events:
        pid = pids[process_of(e)]
        if e["ph"] in ON_THREAD:
            body.append(e | {"pid": pid, "tid": tids[e["tid"]]})
        else:
            body.append({k: v for k, v in e.items() if k != "proc"} | {"pid": pid})
    return meta + body


def from_chrome(trace_events: list[Event]) -> list[Event]:
    """The inverse of `chrome_events` (names back in tid/proc), for a file written earlier;
    raises KeyError/TypeError on a file that is not one."""
    procs = {e["pid"]: str(e["args"]["name"]) for e in trace_events if e["ph"] == "M" and e["name"] == "process_name"}
    names = {e["tid"]: str(e["args"]["name"]) for e in trace_events if e["ph"] == "M" and e["name"] == "thread_name"}
    out = []
    for e in trace_events:
        if e["ph"] in ON_THREAD:
            out.append({k: v for k, v in e.items() if k != "pid"} | {"tid": names[e["tid"]]})
        elif e["ph"] == "C":
            out.append({k: v for k, v in e.items() if k != "pid"} | {"proc": procs.get(e["pid"], "pipeline")})
        elif e["ph"] != "M":
            raise KeyError(f"unexpected event phase {e['ph']!r}")
    return out


def _process_key(name: str) -> tuple[int, str]:
    return (PROCESS_ORDER.index(name) if name in PROCESS_ORDER else len(PROCESS_ORDER), name)


def _thread_key(name: str) -> tuple[tuple[int, str], str, int]:
    worker, _, lane = name.partition(LANE_SEP)
    return _process_key(worker.split("/")[0]), worker, int(lane) if lane.isdigit() else 0
