"""The package's output through `logging`: every logger is under "asyncrl." and the command
line (`asyncrl --log-level LEVEL`) sets one handler on "asyncrl" that writes plain lines to stderr.

Loggers by area: "asyncrl.cli" (a command's own lines and its errors), "asyncrl.run" (what a run
says as it goes: resumes, restarts, stops, dropped rows), "asyncrl.progress" (the per-step
progress: a tqdm bar on a terminal, else a line now and then), "asyncrl.eval". A program that
imports asyncrl as a library configures logging itself; nothing here runs on import.
"""

from __future__ import annotations

import logging
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (tests swap it); a warning
    (a WARNING record, or a line that starts "warning:") is written once: preflight's checks and
    the run's own loaders may find the same thing, and the user reads it once."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.warned: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        message = record.getMessage()
        if record.levelno == logging.WARNING or message.startswith("warning:"):
            if message in self.warned:
                return
            self.warned.add(message)
        super().emit(record)


def setup_logging(level: str = "INFO") -> None:
    """One stderr handler on the "asyncrl" logger at `level` (replacing the one set before)."""
    root = logging.getLogger("asyncrl")
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
