"""What one reward call comes to, and the counts of those outcomes.

Every call of a reward function ends as a `RewardResult` with a status, never as an exception:
- "ok": a finite number, or a dict with a finite number under "score" (its other numeric
  entries become `details`);
- "error": the function raised (anything, `SystemExit` included: a wrong signature is a
  `TypeError` at the call), or its worker process died;
- "timeout": it ran past `reward.timeout_s` (its process was killed, see `pool.py`) or raised
  `RewardTimeout` (the code scorer killing a looping program);
- "invalid": it returned something else (NaN, inf, a string, None, a dict without "score").
Each failure scores 0. `call_reward` makes that result inside a worker process; `RewardStats`
counts the statuses in the trainer's process and logs the first failure of each kind, with its
traceback, to the `asyncrl.reward` logger.

Not here: running calls in processes with deadlines (`pool.py`), scoring rows and responses
through a pool (`scoring.py`), deciding that too many failed (`asyncrl.workers.reward`).
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from asyncrl.errors import ConfigError, RewardTimeout
from asyncrl.rewards.registry import RewardFn, RewardResult, RewardStatus

MAX_ERROR_CHARS = 500
FAILURES = ("error", "timeout", "invalid")
log = logging.getLogger("asyncrl.reward")


class RewardCall(NamedTuple):
    """The arguments of one reward call, as sent to a worker process (verl's compute_score order)."""

    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict[str, Any]


class Outcome(NamedTuple):
    """A call's result plus the full traceback or message behind a failure ("" when ok), for the log."""

    result: RewardResult
    trace: str


def failed(status: RewardStatus, error: str, trace: str = "") -> Outcome:
    """A score-0 outcome of a failure kind ("error", "timeout" or "invalid")."""
    assert status in FAILURES, status
    error = " ".join(error.split())[:MAX_ERROR_CHARS]  # one line: it ends up in a RewardError message
    return Outcome(RewardResult(0.0, status=status, error=error), trace or error)


def call_reward(thunk: Callable[[], Any]) -> Outcome:
    """Run `thunk` (find a reward function and call it); whatever happens becomes an Outcome.

    Example: call_reward(lambda: 1 / 0).result.error == "ZeroDivisionError: division by zero in
    runner.py:<line>" (the innermost frame of the traceback), status "error".
    """
    try:
        value = thunk()
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: the worker must survive it
        status: RewardStatus = "timeout" if isinstance(exc, RewardTimeout) else "error"
        return failed(status, _describe(exc), "".join(traceback.format_exception(exc)))
    return to_outcome(value)


def to_outcome(value: Any) -> Outcome:
    """A float or a {"score": ..., **details} dict as an "ok" outcome; anything else is "invalid"."""
    details: dict[str, float] = {}
    score = value
    if isinstance(value, dict):
        details = {str(k): float(v) for k, v in value.items() if k != "score" and _is_number(v)}
        score = value.get("score")
    if not _is_number(score) or not math.isfinite(float(score)):
        kind = f"a dict without a numeric 'score' (keys {sorted(map(str, value))})" if isinstance(value, dict) \
            else f"{value!r:.100}"
        return failed("invalid", f"reward function returned {kind}, not a finite number or a dict with a 'score'")
    return Outcome(RewardResult(float(score), details=details), "")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)  # int, float, bool and numpy scalars


def _describe(exc: BaseException) -> str:
    """"Type: message in file.py:line", the line being the innermost frame (where it was raised)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def check_signature(fn: RewardFn, custom_function: str) -> None:
    """ConfigError unless `fn(data_source, solution_str, ground_truth, extra_info)` binds."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some C callables have no signature: trust them
        return
    try:
        signature.bind("data_source", "solution_str", "ground_truth", {})
    except TypeError as exc:
        name = getattr(fn, "__name__", repr(fn))
        raise ConfigError(
            f"reward.custom_function='{custom_function}': {name}{signature} cannot be called as "
            f"fn(data_source, solution_str, ground_truth, extra_info) ({exc})") from None


@dataclass
class RewardStats:
    """Thread-safe cumulative counts of each status; logs the first failure of each kind."""

    ok: int = 0
    error: int = 0
    timeout: int = 0
    invalid: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _logged: set[str] = field(default_factory=set, init=False, repr=False)

    def record(self, outcome: Outcome, data_source: str) -> None:
        status = outcome.result.status
        with self._lock:
            setattr(self, status, getattr(self, status) + 1)  # fields named by status
            first = status != "ok" and status not in self._logged
            self._logged.add(status)
        if first:
            log.warning("reward %s (first of this kind; later ones are only counted in metrics) for "
                        "data source '%s': %s\n%s", status, data_source, outcome.result.error, outcome.trace)

    def metrics(self) -> dict[str, float]:
        """Flat metric dict: {"reward/ok_count", "reward/errors", "reward/timeouts", "reward/invalid"}."""
        return {"reward/ok_count": float(self.ok), "reward/errors": float(self.error),
                "reward/timeouts": float(self.timeout), "reward/invalid": float(self.invalid)}
