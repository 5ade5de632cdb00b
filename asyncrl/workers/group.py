"""Worker handles: one small interface over the substrates a worker can live on.

Pipelines never touch a worker object directly; they `await handle.call("method", ...)`:
- local (`LocalHandle`): the object lives in this process. Coroutine methods run on the
  caller's event loop (the rollout engine needs that); plain methods run on the worker's own
  thread, so a training step overlaps generation instead of blocking the loop;
- ray (`asyncrl.workers.ray_host`): the object lives in a Ray actor on its resource pool and
  `call` awaits the remote method.
Workers are plain classes built by a factory function *inside* their host, so a Ray actor
builds its own model instead of receiving one through pickling.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol


class WorkerHandle(Protocol):
    name: str

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


class LocalHandle:
    """A worker object in this process, with a private thread for its blocking methods."""

    def __init__(self, name: str, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.name = name
        self.obj = factory(*args, **kwargs)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.obj, method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        closer = getattr(self.obj, "close", None)
        if callable(closer):
            closer()
