"""The exceptions asyncrl raises at the outside world.

Each subclasses the stdlib exception a caller would expect (so `except ValueError` still works)
and is picklable, so it crosses a Ray boundary intact. Programmer errors stay `assert`s.
"""

from __future__ import annotations


class AsyncRLError(Exception):
    """Base of every asyncrl error."""


class ConfigError(AsyncRLError, ValueError):
    """A configuration value is missing, mistyped or inconsistent; the message names the key."""


class ConfigErrors(ConfigError):
    """Several refusals of one command line (or one GRPOConfig), one per line, each naming its key:
    reported together, so that a recipe is fixed in one go."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class DataError(AsyncRLError, ValueError):
    """A dataset row is malformed; the message names the file, the row and the field."""


class RolloutError(AsyncRLError, RuntimeError):
    """A rollout engine failed or was asked for something it cannot do."""


class RewardError(AsyncRLError, RuntimeError):
    """Too many rewards of a step failed; the message names the kind and the first traceback."""


class RewardTimeout(AsyncRLError, TimeoutError):
    """A reward function ran past its time limit (turned into a score-0 result, never raised out)."""


class SyncError(AsyncRLError, RuntimeError):
    """A weight sync failed or the engine's weights do not match what the trainer sent."""


class WorkerDied(AsyncRLError, RuntimeError):
    """A worker process (e.g. a Ray actor) died; the message names its role ("rollout worker 1")."""


class OutOfMemory(AsyncRLError, MemoryError):
    """A device ran out of memory; the message says where and names the keys that lower the need."""


class CheckpointError(AsyncRLError, OSError):
    """A checkpoint could not be written or read back (damaged, in the old pickle format, or with
    weights that are zero or not finite); the message names the checkpoint or file and the cause."""


class RunDirBusy(AsyncRLError, RuntimeError):
    """Another run holds the run directory's lock; the message names its host and pid."""
