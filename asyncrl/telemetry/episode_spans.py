"""An episode's model turns and tool calls as timed spans, carried in `Trajectory.timings`.

`Trajectory.timings` is a flat `dict[str, float]` that crosses Ray, the queue and checkpoints
as it is, so a span is a few keys under `span/<i>/<name>/` (`i`: the order recorded):

    span/0/turn/start, span/0/turn/end, span/0/turn/turn (1.0), span/0/turn/tokens (12.0)
    span/1/tool:calculator/start, .../end, .../seconds (0.8), .../status=ok (1.0)

A field written `key=value` holds a string (the value is in the key; the number is 1.0).
`EpisodeBuilder.span` writes them (`asyncrl.agents.episode`); `Trace.add_group` draws them as
spans on the episode's lane, inside its generation span (`asyncrl.telemetry.trace`).
Not here: reading a clock (the caller passes `clock.now()` readings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "span/"


@dataclass(frozen=True)
class EpisodeSpan:
    name: str
    """"turn" (a model turn) or "tool:<name>" (a tool call)."""
    start: float
    end: float
    """`clock.now()` readings."""
    args: dict[str, float | int | str]


def span_timings(index: int, name: str, start: float, end: float,
                 fields: Mapping[str, float | int | str]) -> dict[str, float]:
    """The timings keys of span `index`. Example: span_timings(1, "tool:add", 3.0, 4.5,
    {"status": "ok", "seconds": 1.5}) -> {"span/1/tool:add/start": 3.0, "span/1/tool:add/end": 4.5,
    "span/1/tool:add/status=ok": 1.0, "span/1/tool:add/seconds": 1.5}."""
    base = f"{PREFIX}{index}/{name}/"
    out = {base + "start": start, base + "end": end}
    for key, value in fields.items():
        assert "/" not in key and "=" not in key, key
        if isinstance(value, str):
            out[f"{base}{key}={value.replace('/', '_')}"] = 1.0
        else:
            out[base + key] = float(value)
    return out


def read_spans(timings: Mapping[str, float]) -> list[EpisodeSpan]:
    """The spans `span_timings` wrote into `timings`, in the order recorded; integral numbers
    come back as ints. A span missing its start or end is skipped."""
    found: dict[int, tuple[str, dict[str, float | int | str]]] = {}
    for key, value in timings.items():
        if not key.startswith(PREFIX):
            continue
        index, _, rest = key[len(PREFIX):].partition("/")
        name, _, field = rest.rpartition("/")
        if not index.isdigit() or not name:
            continue
        args = found.setdefault(int(index), (name, {}))[1]
        field, is_text, text = field.partition("=")
        args[field] = text if is_text else (int(value) if float(value).is_integer() else float(value))
    spans = []
    for _, (name, args) in sorted(found.items()):
        start, end = args.pop("start", None), args.pop("end", None)
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):
            spans.append(EpisodeSpan(name, float(start), float(end), args))
    return spans
