"""Run reward functions so that they can never crash or stall the pipeline.

`score_response` calls a `RewardFn` (see `registry.py`) on one response and always returns a
`RewardResult`: an exception becomes score 0 / status "error" (text in `.error`), a
`RewardTimeout` raised by the function (e.g. the code scorer killing a looping program) or a
call still running after `timeout_s` becomes score 0 / status "timeout". `RewardStats` counts
the outcomes for metrics (`reward/error_count`, `reward/timeout_count`).

Why threads, and what that costs: each call runs in its own daemon thread and the caller waits
at most `timeout_s` for it. Python cannot kill a thread, so a hung function is *abandoned*, not
stopped: it keeps its thread (and CPU, if it spins) until it returns or the process exits
(daemon threads never block exit). `RewardStats.abandoned` counts those still alive. Threads
were chosen over a process pool because user functions from `reward.custom_function` need not
pickle and scoring is mostly cheap; the one routinely dangerous case, model-written code, is run
by `code_exec.py` in a subprocess that *is* killed at its own timeout. Keep that timeout below
`timeout_s` here so the kill path, not abandonment, handles it.

`score_batch` scores many responses with a small thread pool; CPU-bound scorers share the GIL,
so the gain is in overlapping subprocess waits (code), not in pure-Python math parsing.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asyncrl.errors import RewardTimeout
from asyncrl.rewards.registry import RewardFn, RewardResult
from asyncrl.types import PromptRow

MAX_ERROR_CHARS = 500


@dataclass
class RewardStats:
    """Thread-safe outcome counters. `abandoned` is read live: hung calls still running."""

    ok: int = 0
    error: int = 0
    timeout: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _hung: list[threading.Thread] = field(default_factory=list, init=False, repr=False)

    def record(self, result: RewardResult, worker: threading.Thread | None = None) -> None:
        with self._lock:
            setattr(self, result.status, getattr(self, result.status) + 1)  # fields named by status
            if result.status == "timeout" and worker is not None and worker.is_alive():
                self._hung.append(worker)

    @property
    def abandoned(self) -> int:
        with self._lock:
            self._hung = [t for t in self._hung if t.is_alive()]
            return len(self._hung)

    def metrics(self) -> dict[str, float]:
        """Flat metric dict, e.g. {"reward/error_count": 2.0, ...} (cumulative counts)."""
        return {"reward/ok_count": float(self.ok), "reward/error_count": float(self.error),
                "reward/timeout_count": float(self.timeout),
                "reward/abandoned_count": float(self.abandoned)}


def score_response(
    row: PromptRow, response_text: str, *, reward_fn: RewardFn,
    timeout_s: float = 10.0, stats: RewardStats | None = None,
) -> RewardResult:
    """Score one response; never raises, never blocks much longer than `timeout_s`."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def call() -> None:
        try:
            box["value"] = reward_fn(row.data_source, response_text, row.ground_truth, dict(row.extra_info))
        except BaseException as exc:  # noqa: BLE001 - any failure becomes a result
            box["exc"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=call, name=f"reward-{row.uid}", daemon=True)
    worker.start()
    if done.wait(timeout_s):
        result = _to_result(box)
    else:
        result = RewardResult(0.0, status="timeout", error=f"reward function still running after {timeout_s:g} s")
    if stats is not None:
        stats.record(result, worker)
    return result


def _to_result(box: dict[str, Any]) -> RewardResult:
    exc = box.get("exc")
    if isinstance(exc, RewardTimeout):
        return RewardResult(0.0, status="timeout", error=_text(exc))
    if exc is not None:
        return RewardResult(0.0, status="error", error=_text(exc))
    return _from_value(box["value"])


def _from_value(value: Any) -> RewardResult:
    """Turn a float or a {"score": ..., **details} dict into a result (bad shapes are errors)."""
    details: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            return RewardResult(0.0, status="error", error=f"reward dict has no 'score' key: keys {sorted(value)}")
        details = {k: float(v) for k, v in value.items() if k != "score" and _is_number(v)}
        value = value["score"]
    if not _is_number(value) or not math.isfinite(float(value)):
        return RewardResult(0.0, status="error", error=f"reward is not a finite number: {value!r:.100}")
    return RewardResult(float(value), details=details)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)  # int, float, bool and numpy scalars


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def score_batch(
    rows: Sequence[PromptRow], responses: Sequence[str], *, reward_fn: RewardFn,
    timeout_s: float = 10.0, max_workers: int = 4, stats: RewardStats | None = None,
) -> list[RewardResult]:
    """Score `responses[i]` against `rows[i]` concurrently; results in input order.

    Every call is bounded by `timeout_s`, so the batch takes at most about
    ceil(len / max_workers) * timeout_s even if every function hangs.
    """
    assert len(rows) == len(responses), (len(rows), len(responses))
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward-pool") as pool:
        futures = [pool.submit(score_response, row, text, reward_fn=reward_fn, timeout_s=timeout_s, stats=stats)
                   for row, text in zip(rows, responses)]
        return [f.result() for f in futures]
