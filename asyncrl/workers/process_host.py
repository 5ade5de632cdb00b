"""The processes substrate's transport: worker objects in spawned processes on this machine,
reached by method name over a pipe. No Ray: the GPU machines this runs on may not have it.

`ProcessHandle(name, factory, *args)` starts a process (multiprocessing "spawn", which is safe
with CUDA and threads), builds `factory(*args)` there in a `HostedWorker` and serves calls on
that process's event loop: coroutine methods run concurrently, `@blocking` ones in order on the
process's compute thread. `Proxy(handle)` (see `asyncrl.workers.handles`) is what pipelines hold.

Messages go through the standard pickler, so tensors in arguments and results are copied. Weights
do not travel this way: the "ipc" transport shares one buffer between the processes once
(`asyncrl.sync.shared`) and each sync copies through it.

Failure semantics, as `RayHandle`'s: an exception raised by a worker method (or its factory)
comes out of `await handle.call(...)` with its own type, the remote traceback chained as its
cause. A process that dies fails every call in flight, and every later one, with `WorkerDied`
naming the role. A served process exits when its pipe closes, so if the driver dies, its
workers go with it; signals sent to the driver's process group do not reach them.

Not here: restarts, several machines, placement (use Ray for those); which threads a process
runs (the substrate says).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from asyncrl.errors import WorkerDied
from asyncrl.workers.handles import HostedWorker

CLOSE_TIMEOUT_S = 30.0
"""How long `ProcessHandle.close` waits for the worker's own `close()` before killing it."""

Message = tuple[Any, ...]


class RemoteTraceback(Exception):
    """The traceback of a worker exception, as text from the worker's process."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _dumps(message: Message) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _picklable(err: BaseException) -> BaseException:
    """`err` if it survives pickling, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")


class ProcessHandle:
    """A worker object living in a spawned process, called by method name (`Proxy` wraps it).

    `setup()` runs in the process before the factory (e.g. to cap its share of a GPU);
    `num_threads` is the torch threads of its compute thread."""

    def __init__(self, name: str, factory: Callable[..., Any], *args: Any, num_threads: int = 1,
                 setup: Callable[[], None] | None = None, **kwargs: Any) -> None:
        self.name = name
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, setup, factory, args, kwargs, num_threads),
                                   name=f"asyncrl {name}")
        self.process.start()
        child.close()  # the process's end lives there only: its exit is our EOF
        self._ids = itertools.count()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._lock = threading.Lock()
        self._dead: WorkerDied | None = None
        self._closed = False
        self._reader = threading.Thread(target=self._read, name=f"asyncrl-pipe-{name}", daemon=True)
        self._reader.start()
        atexit.register(self.close)  # before multiprocessing's own exit hook joins the process

    async def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """`method` on the worker; cancelling the await cancels it there."""
        return await self._request("call", method, args, kwargs)

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run a picklable module-level function inside the worker's process (on a spare thread)."""
        return await self._request("run", fn, args, kwargs)

    async def node_ip(self) -> str:
        return "127.0.0.1"

    async def pid(self) -> int:
        return await self.run(os.getpid)

    async def _request(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._dead is not None:
                raise self._dead
            request = next(self._ids)
            self._pending[request] = (loop, future)
        try:
            self._send((kind, request, target, args, kwargs))
            return await future
        except asyncio.CancelledError:
            with self._lock:
                waiting = self._pending.pop(request, None) is not None
            if waiting:
                self._send(("cancel", request))
            raise

    def _send(self, message: Message) -> None:
        data = _dumps(message)
        with self._lock:
            if self._dead is not None:
                raise self._dead
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as err:  # the process is gone (the reader says so too)
                raise WorkerDied(f"{self.name} died; see its log above") from err

    def _read(self) -> None:
        """Resolve each answer on the loop that asked; on EOF, fail everything pending."""
        try:
            while True:
                request, ok, value = pickle.loads(self._conn.recv_bytes())
                with self._lock:
                    waiter = self._pending.pop(request, None)
                if waiter is not None:
                    waiter[0].call_soon_threadsafe(_settle, waiter[1], ok, value)
        except (EOFError, OSError):
            pass
        self.process.join(timeout=5)
        code = self.process.exitcode
        died = WorkerDied(f"{self.name} died (exit code {code}); see its log above")
        with self._lock:
            self._dead = died
            pending, self._pending = list(self._pending.values()), {}
        for loop, future in pending:
            loop.call_soon_threadsafe(_settle, future, False, (died, ""))

    def close(self) -> None:
        """Close the worker object (its `close()`, if any), then end the process. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._send(("shutdown", -1))
        except WorkerDied:
            pass
        self.process.join(CLOSE_TIMEOUT_S)
        if self.process.is_alive():  # stuck in close(): killing it is all that is left to do
            self.process.kill()
            self.process.join()
        self._conn.close()
        self._reader.join(timeout=5)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # cancelled meanwhile
        return
    if ok:
        future.set_result(value)
        return
    err, remote_tb = value
    if remote_tb:
        err.__cause__ = RemoteTraceback(remote_tb)
    future.set_exception(err)


def _serve(conn: Connection, setup: Callable[[], None] | None, factory: Callable[..., Any],
           args: tuple[Any, ...], kwargs: dict[str, Any], num_threads: int) -> None:
    """The process's main: serve calls until told to shut down or the pipe closes, then exit.

    In a session of its own, so a terminal's Ctrl-C or a `timeout` reaches the driver alone,
    which stops the run in order (finishes the update, checkpoints) and then closes its workers."""
    os.setsid()
    if setup is not None:
        setup()
    asyncio.run(_Server(conn).serve(HostedWorker(factory, args, kwargs, num_threads)))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: every thread that matters was shut down above


class _Server:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.done = asyncio.Event()

    async def serve(self, worker: HostedWorker) -> None:
        self.worker = worker
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="asyncrl-pipe", daemon=True).start()
        await self.done.wait()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while True:
                loop.call_soon_threadsafe(self._dispatch, pickle.loads(self.conn.recv_bytes()))
        except (EOFError, OSError):  # the driver is gone: shut down as if told to
            loop.call_soon_threadsafe(self._dispatch, ("shutdown", -1))

    def _dispatch(self, message: Message) -> None:
        kind, request = message[0], message[1]
        if kind == "cancel":
            task = self.tasks.get(request)
            if task is not None:
                task.cancel()
        elif kind == "shutdown":
            asyncio.ensure_future(self._shutdown())
        else:
            target, args, kwargs = message[2:]
            work = (self.worker.call(target, *args, **kwargs) if kind == "call"
                    else asyncio.to_thread(target, *args, **kwargs))
            self.tasks[request] = asyncio.ensure_future(self._answer(request, work))

    async def _answer(self, request: int, work: Any) -> None:
        try:
            reply: Message = (request, True, await work)
        except asyncio.CancelledError:
            return  # the caller stopped waiting
        except BaseException as err:  # noqa: BLE001 - every failure goes back to the caller
            reply = (request, False, (_picklable(err), traceback.format_exc()))
        finally:
            self.tasks.pop(request, None)
        self._reply(reply)

    def _reply(self, reply: Message) -> None:
        try:
            data = _dumps(reply)
        except Exception as err:  # an unpicklable result
            data = _dumps((reply[0], False, (RuntimeError(f"result not picklable: {err}"), "")))
        with self.lock:
            try:
                self.conn.send_bytes(data)
            except OSError:  # the driver is gone
                pass

    async def _shutdown(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await self.worker.shutdown()
        self.done.set()
