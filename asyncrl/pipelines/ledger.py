"""`samples.jsonl`: one line per trained group, in every pipeline, so a run can be audited.

A line says which prompt was trained at which update (`step`), under which policy version, and
from which versions its tokens came; per response (`_G`, in group order) its trained length in
tokens, its version lag (the trained version minus the version of its first token) and how many
versions produced it (more than one: partial rollout continued it after a sync). On resume the
ledger rolls back to the checkpoint (`rollback(step)` keeps the lines of steps up to it), so it
always lists exactly the prompts the current weights were trained on: a prompt listed twice was
trained twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from asyncrl.fsutil import atomic_write_text
from asyncrl.types import Group


class SampleLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a")

    def record(self, groups: Sequence[Group], step: int, version: int) -> None:
        for g in groups:
            first, last, segments = zip(*[t.version_span() for t in g.trajectories])
            self._file.write(json.dumps({
                "step": step, "uid": g.uid, "prompt": g.row.uid, "trained_at_version": version,
                "start_version": min(first), "end_version": max(last), "segments": max(segments),
                "lengths_G": [len(t.response_ids) for t in g.trajectories],
                "lags_G": [version - f for f in first], "segments_G": list(segments)}) + "\n")
        self._file.flush()

    def rollback(self, step: int) -> int:
        """Keep only the groups trained up to `step` (a line cut by a kill is dropped); how many
        lines were removed."""
        self._file.close()
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if _step(line) <= step]
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))
        self._file = self.path.open("a")
        return len(lines) - len(kept)

    def close(self) -> None:
        self._file.close()


def _step(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")  # a line cut short
