"""TRL-signature reward functions: `f(prompts, completions, **columns) -> list[float | None]`.

`reward.functions` names them ('module:fn' or 'file.py:fn', importable in any process) or, from
the Python API (`asyncrl.api.Trainer`), refers to callables registered in this process
(`register_callable`: a lambda, a closure, a function defined in a notebook), which exist only
here: such a run must keep its reward worker in this process (`backend=local`).

`BatchFunctions.score(rows, texts)` calls every function once per batch, as TRL does, in a thread
pool of the reward worker's process, with TRL's arguments: `prompts` (the row's raw text, or its
messages for a conversational row), `completions` (the text, or `[{"role": "assistant",
"content": text}]` for a conversational row), and one list per dataset column (the row's
`extra_info` entries, plus `ground_truth` and `data_source`). The reward is TRL's: the weighted
sum over functions (`reward.function_weights`, default 1 each), a function's None meaning "does
not apply" (skipped); a response every function skipped scores 0 with status "invalid". A
function that raises, returns the wrong number of values or a non-number fails its batch (score
0, status "error", counted); one still running after `reward.timeout_s` fails it with status
"timeout" (a thread cannot be killed: it runs on, and the pool grows by one thread).

Not here: the per-response verl-signature scorers and their process pool (`pool.py`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast

from asyncrl.errors import ConfigError
from asyncrl.rewards.registry import RewardResult, RewardStatus, load_custom_function
from asyncrl.types import PromptRow

BatchFn = Callable[..., Sequence[float | None]]
DRIVER_PREFIX = "driver:"
"""`reward.functions` entries naming a callable registered in this process."""

_CALLABLES: dict[str, BatchFn] = {}
_LOCK = threading.Lock()


def register_callable(fn: BatchFn) -> str:
    """Keep `fn` for this process's runs; returns the `reward.functions` entry that names it."""
    name = f"{DRIVER_PREFIX}{getattr(fn, '__qualname__', type(fn).__name__)}#{id(fn):x}"
    with _LOCK:
        _CALLABLES[name] = fn
    return name


def resolve(spec: str) -> BatchFn:
    """The function a `reward.functions` entry names (ConfigError naming the key if it cannot be had)."""
    if spec.startswith(DRIVER_PREFIX):
        with _LOCK:
            fn = _CALLABLES.get(spec)
        if fn is None:
            raise ConfigError(f"reward.functions: {spec} is a Python callable of another process; it can run only "
                              f"where it was defined: use backend=local, or name an importable 'module:fn'")
        return fn
    return cast(BatchFn, load_custom_function(spec))  # the same import rule, another signature


def function_name(spec: str) -> str:
    """The detail key of a function's score: its name without module or id."""
    return spec.removeprefix(DRIVER_PREFIX).rsplit("#", 1)[0].rpartition(":")[2].rsplit(".", 1)[-1]


class BatchFunctions:
    """The weighted sum of TRL-signature functions, each called once per batch (see the module docstring)."""

    def __init__(self, specs: Sequence[str], weights: Sequence[float], timeout_s: float) -> None:
        if weights and len(weights) != len(specs):
            raise ConfigError(f"reward.function_weights has {len(weights)} weights for {len(specs)} "
                              f"reward.functions; give one per function, or none")
        self.fns = [resolve(s) for s in specs]
        self.names = [function_name(s) for s in specs]
        self.weights = list(weights) or [1.0] * len(specs)
        self.timeout_s = timeout_s
        self._threads = ThreadPoolExecutor(max_workers=max(len(specs), 1), thread_name_prefix="asyncrl-reward-fn")

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str]) -> list[RewardResult]:
        """One result per (row, text): the weighted sum of the functions' values."""
        kwargs = trl_arguments(rows, texts)
        futures = [self._threads.submit(fn, **kwargs) for fn in self.fns]
        columns: list[list[float | None]] = []
        for name, future in zip(self.names, futures):
            values = self._values(name, future, len(texts))
            if isinstance(values, str):
                status: RewardStatus = "timeout" if values.startswith("timeout") else "error"
                return [RewardResult(0.0, status=status, error=values) for _ in texts]
            columns.append(values)
        return [self._combine([c[i] for c in columns]) for i in range(len(texts))]

    def _values(self, name: str, future: Future[Any], n: int) -> list[float | None] | str:
        """The function's n values, or the one-line reason its batch fails."""
        try:
            values = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            return f"timeout: reward function {name} still running after {self.timeout_s:g} s (reward.timeout_s)"
        except Exception as exc:  # noqa: BLE001 - a user's function may raise anything
            return f"reward function {name} raised {type(exc).__name__}: {exc}"
        if not isinstance(values, Sequence) or len(values) != n:
            return f"reward function {name} returned {_describe(values)}, not a list of {n} values"
        bad = [v for v in values if not _number_or_none(v)]
        if bad:
            return f"reward function {name} returned {bad[0]!r}, not a finite number or None"
        return [None if v is None else float(v) for v in values]

    def _combine(self, values: list[float | None]) -> RewardResult:
        applied = [(w, v) for w, v in zip(self.weights, values) if v is not None]
        details = {name: v for name, v in zip(self.names, values) if v is not None}
        if not applied:
            return RewardResult(0.0, details, "invalid", "every reward function returned None")
        return RewardResult(sum(w * v for w, v in applied), details)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


def trl_arguments(rows: Sequence[PromptRow], texts: Sequence[str]) -> dict[str, list[Any]]:
    """TRL's keyword arguments for a batch: prompts, completions and one list per column."""
    prompts = [r.text or [dict(m) for m in r.messages] for r in rows]
    completions: list[Any] = [t if r.text else [{"role": "assistant", "content": t}] for r, t in zip(rows, texts)]
    keys = sorted({k for r in rows for k in r.extra_info} - {"prompts", "completions"})
    columns = {k: [r.extra_info.get(k) for r in rows] for k in keys}
    return {"prompts": prompts, "completions": completions, "ground_truth": [r.ground_truth for r in rows],
            "data_source": [r.data_source for r in rows], **columns}


def _number_or_none(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _describe(value: Any) -> str:
    return f"{len(value)} values" if isinstance(value, Sequence) and not isinstance(value, str) else repr(value)[:60]
