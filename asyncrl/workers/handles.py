"""How a pipeline reaches a worker, on each substrate, behind the worker's own (typed) methods.

Every role method (`asyncrl.roles`) is a coroutine, so a pipeline always writes
`await ctx.trainer.train_groups(groups)`; what stands behind `ctx.trainer` depends on the substrate:
- in-process (local, sim): the worker object itself. Coroutines run on the caller's event loop
  (the rollout engine needs that); a method marked `@blocking` runs on the object's own worker
  thread, one call at a time, so a training step overlaps generation instead of blocking the loop;
- another process (Ray actor, `asyncrl.workers.ray_host`; spawned process,
  `asyncrl.workers.process_host`): a `Proxy` whose attribute access sends the call there, typed
  by the substrate as the worker class it hosts, so a static check sees the same methods. There
  a `HostedWorker` builds the object and dispatches the calls.

Not here: building workers (`asyncrl.substrates`), the Ray actor or the process itself.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import torch

from asyncrl.compute import compute_thread, pin_threads, quiet_event_loop

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")

_THREAD_ATTR = "_asyncrl_worker_thread"


def blocking(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Make a blocking method awaitable: it runs on its object's worker thread, in call order.

    The thread is created on first use with the object's `num_threads` torch threads if it has
    that attribute (non-zero), else the caller's (torch's intra-op thread count is per thread);
    `close_worker` stops it.
    """

    @functools.wraps(method)
    async def run_on_worker_thread(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_worker_thread(self), functools.partial(method, self, *args, **kwargs))

    return run_on_worker_thread


def _worker_thread(obj: Any) -> ThreadPoolExecutor:
    pool: ThreadPoolExecutor | None = obj.__dict__.get(_THREAD_ATTR)
    if pool is None:
        pool = compute_thread(getattr(obj, "num_threads", 0) or torch.get_num_threads(), type(obj).__name__)
        obj.__dict__[_THREAD_ATTR] = pool
    return pool


def share_worker_thread(obj: Any, pool: ThreadPoolExecutor) -> None:
    """Run `obj`'s `@blocking` methods on `pool`, a compute thread it shares (`asyncrl.compute`),
    unless they already have a thread. `close_worker(obj)` still shuts it down, so close the
    object last among those sharing it."""
    if hasattr(obj, "__dict__"):
        obj.__dict__.setdefault(_THREAD_ATTR, pool)


def close_worker(obj: Any) -> None:
    """Stop the object's worker thread (pending calls are cancelled), then its own `close()`."""
    pool: ThreadPoolExecutor | None = obj.__dict__.pop(_THREAD_ATTR, None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    closer = getattr(obj, "close", None)
    if callable(closer):
        closer()


class Caller(Protocol):
    """What a `Proxy` forwards to: one remote call by method name."""

    name: str

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Awaitable[Any]: ...


class Proxy:
    """A worker in another process, seen through its methods: `await proxy.train_groups(g)`
    becomes `await caller.call("train_groups", g)`. Only the substrate constructs one, and it
    types it as the hosted worker class (see `asyncrl.workers.ray_host.RaySubstrate.spawn`)."""

    __slots__ = ("_caller",)

    def __init__(self, caller: Caller) -> None:
        self._caller = caller

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        return functools.partial(self._caller.call, method)

    def __repr__(self) -> str:
        return f"Proxy({self._caller.name})"


class HostedWorker:
    """One worker object in a host process (Ray actor or spawned process), called by method name.

    All torch work of the process runs on one compute thread (`asyncrl.compute`): the object is
    built there (a factory taking `compute` gets it) and its `@blocking` methods run there. A
    factory's exception is re-raised by every call, so it surfaces with its own type."""

    def __init__(self, factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 num_threads: int) -> None:
        self.compute = compute_thread(num_threads, "asyncrl-compute")
        pin_threads(1)
        self._quiet = False
        self.obj: Any = None
        self._init_error: BaseException | None = None
        if "compute" in inspect.signature(factory).parameters:
            kwargs = {**kwargs, "compute": self.compute}
        try:
            self.obj = self.compute.submit(factory, *args, **kwargs).result()
            share_worker_thread(self.obj, self.compute)
        except Exception as err:
            self._init_error = err

    async def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """From the host's event loop (which is made quiet on the first call)."""
        if self._init_error is not None:
            raise self._init_error
        if not self._quiet:
            quiet_event_loop(asyncio.get_running_loop())
            self._quiet = True
        result = getattr(self.obj, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def shutdown(self) -> None:
        if self.obj is not None:
            await asyncio.to_thread(close_worker, self.obj)
        self.compute.shutdown(wait=False)
