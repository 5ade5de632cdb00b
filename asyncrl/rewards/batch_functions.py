"""TRL-signature reward functions: `f(prompts, completions, **columns) -> list[float | None]`.

`reward.functions` names them ('module:fn' or 'file.py:fn', importable in any process) or, from
the Python API (`asyncrl.api.Trainer`), refers to callables registered in the driver process
(`register_callable`: a lambda, a closure, a function defined in a notebook), which exist only
there: entries "driver:<name>#<id>", with the address of the driver's `DriverServer` appended
(`serve_from_driver`) when the reward worker runs in another process.

`BatchFunctions.score(rows, texts)` calls every function once per batch, as TRL does: an
importable one in the reward worker's process pool (`RewardPool.run_batch`: its own process,
killed past its deadline, as the verl-signature scorers), a driver callable in a thread pool of the
driver (directly when the reward worker is the driver's, else through its `DriverServer`). Each
gets TRL's arguments: `prompts` (the row's raw text, or its
messages for a conversational row), `completions` (the text, or `[{"role": "assistant",
"content": text}]` for a conversational row), and one list per dataset column (the row's
`extra_info` entries, plus `ground_truth` and `data_source`). The reward is TRL's: the weighted
sum over functions (`reward.function_weights`, default 1 each), a function's None meaning "does
not apply" (skipped); a response every function skipped scores 0 with status "invalid". A
function that raises, returns the wrong number of values or a non-number fails its batch (score
0, status "error", counted); one still running after `reward.timeout_s` fails it with status
"timeout" (in the pool its process is killed; a driver callable's thread cannot be, and runs on).

Not here: the per-response verl-signature scorers and the process pool (`pool.py`), the driver's
server (`driver_calls.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast

from asyncrl.errors import ConfigError
from asyncrl.rewards.driver_calls import DriverServer, RemoteFunction
from asyncrl.rewards.pool import BatchCall, RewardPool
from asyncrl.rewards.registry import RewardResult, load_custom_function
from asyncrl.rewards.trl_values import DRIVER_PREFIX, batch_values, call_trl, function_name
from asyncrl.types import PromptRow

BatchFn = Callable[..., Sequence[float | None]]

_CALLABLES: dict[str, BatchFn] = {}
_SERVERS: dict[str, DriverServer] = {}  # by host
_LOCK = threading.Lock()


def register_callable(fn: BatchFn) -> str:
    """Keep `fn` for this process's runs; returns the `reward.functions` entry that names it."""
    name = f"{DRIVER_PREFIX}{getattr(fn, '__qualname__', type(fn).__name__)}#{id(fn):x}"
    with _LOCK:
        _CALLABLES[name] = fn
    return name


def serve_from_driver(specs: Sequence[str], host: str = "127.0.0.1") -> tuple[str, ...]:
    """The entries, each callable of this process given the address of a server (started on first
    use, listening on `host`) through which reward workers in other processes call it here."""
    if not any(s.startswith(DRIVER_PREFIX) for s in specs):
        return tuple(specs)
    with _LOCK:
        server = _SERVERS.get(host) or _SERVERS.setdefault(host, DriverServer(host, _registered))
    return tuple(server.spec(s) if s.startswith(DRIVER_PREFIX) else s for s in specs)


def _registered(spec: str) -> BatchFn | None:
    with _LOCK:
        return _CALLABLES.get(spec.split("@", 1)[0])


def resolve(spec: str) -> BatchFn:
    """The function a `reward.functions` entry names (ConfigError naming the key if it cannot be had):
    in the driver a registered callable itself, elsewhere a `RemoteFunction` calling it there."""
    if spec.startswith(DRIVER_PREFIX):
        fn = _registered(spec)
        if fn is not None:
            return fn
        if "@" in spec:
            return RemoteFunction(spec)
        raise ConfigError(f"reward.functions: {spec} is a Python callable of another process; it runs only "
                          f"in the process that defined it: build the run with asyncrl.Trainer there, or name "
                          f"an importable 'module:fn'")
    return cast(BatchFn, load_custom_function(spec))  # the same import rule, another signature


class BatchFunctions:
    """The weighted sum of TRL-signature functions, each called once per batch (see the module docstring)."""

    def __init__(self, specs: Sequence[str], weights: Sequence[float], timeout_s: float,
                 pool: RewardPool | None = None) -> None:
        """`pool`: the reward worker's process pool, where importable functions run (without one,
        in this process's threads)."""
        if weights and len(weights) != len(specs):
            raise ConfigError(f"reward.function_weights has {len(weights)} weights for {len(specs)} "
                              f"reward.functions; give one per function, or none")
        self.specs = list(specs)
        self.fns = [resolve(s) for s in specs]  # resolved here too: a wrong name fails before any call
        self.in_pool = [pool is not None and not s.startswith(DRIVER_PREFIX) for s in specs]
        self.names = [function_name(s) for s in specs]
        self.weights = list(weights) or [1.0] * len(specs)
        self.timeout_s = timeout_s
        self.pool = pool
        self._threads = ThreadPoolExecutor(max_workers=max(len(specs), 1), thread_name_prefix="asyncrl-reward-fn")

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str], ids: Sequence[Sequence[int]] = (),
              step: int = 0) -> list[RewardResult]:
        """One result per (row, text): the weighted sum of the functions' values. `ids`: the texts'
        token ids (TRL's completion_ids); `step`: the policy version (TRL's trainer_state.global_step)."""
        kwargs = trl_arguments(rows, texts, ids, step)
        futures = [self._threads.submit(self._call, i, kwargs) for i in range(len(self.fns))]
        columns: list[list[float | None]] = []
        for i, future in enumerate(futures):
            values = self._values(i, future)
            if isinstance(values, RewardResult):
                return [values for _ in texts]
            columns.append(values)
        return [self._combine([c[i] for c in columns]) for i in range(len(texts))]

    def _call(self, i: int, kwargs: dict[str, list[Any]]) -> list[float | None] | str | RewardResult:
        """Function i's checked values, the one-line reason they are wrong, or the pool's failure."""
        if self.in_pool[i]:
            assert self.pool is not None
            reply = self.pool.run_batch(BatchCall(self.specs[i], kwargs))
            return reply if isinstance(reply, list) else reply.result
        fn = self.fns[i]
        values = fn(**kwargs) if isinstance(fn, RemoteFunction) else call_trl(fn, kwargs)
        return batch_values(self.names[i], values, len(kwargs["prompts"]))

    def _values(self, i: int, future: Future[Any]) -> list[float | None] | RewardResult:
        """Function i's values, or the failed result of its whole batch. The pool keeps its own deadline."""
        name = self.names[i]
        try:
            values = future.result(timeout=None if self.in_pool[i] else self.timeout_s)
        except FutureTimeout:
            return RewardResult(0.0, status="timeout", error=f"timeout: reward function {name} still running "
                                                             f"after {self.timeout_s:g} s (reward.timeout_s)")
        except Exception as exc:  # noqa: BLE001 - a user's function may raise anything
            return RewardResult(0.0, status="error", error=f"reward function {name} raised {type(exc).__name__}: {exc}")
        if isinstance(values, str):
            return RewardResult(0.0, status="error", error=values)
        return cast("list[float | None] | RewardResult", values)

    def _combine(self, values: list[float | None]) -> RewardResult:
        applied = [(w, v) for w, v in zip(self.weights, values) if v is not None]
        details = {name: v for name, v in zip(self.names, values) if v is not None}
        if not applied:
            return RewardResult(0.0, details, "invalid", "every reward function returned None")
        return RewardResult(sum(w * v for w, v in applied), details)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


def trl_arguments(rows: Sequence[PromptRow], texts: Sequence[str], ids: Sequence[Sequence[int]] = (),
                  step: int = 0) -> dict[str, Any]:
    """TRL's keyword arguments for a batch: prompts, completions, completion_ids, trainer_state (as
    a dict: `call_trl` makes it the object) and one list per column."""
    prompts = [r.text or [dict(m) for m in r.messages] for r in rows]
    completions: list[Any] = [t if r.text else [{"role": "assistant", "content": t}] for r, t in zip(rows, texts)]
    keys = sorted({k for r in rows for k in r.extra_info} - {"prompts", "completions", "completion_ids",
                                                             "trainer_state"})
    columns = {k: [r.extra_info.get(k) for r in rows] for k in keys}
    return {"prompts": prompts, "completions": completions, "completion_ids": [list(i) for i in ids],
            "trainer_state": {"global_step": step}, "ground_truth": [r.ground_truth for r in rows],
            "data_source": [r.data_source for r in rows], **columns}
