"""Reward callables that exist only in the driver, called from a reward worker in another process.

A lambda, a closure or a function defined in a notebook cannot be imported by name, so a reward
worker in another process (the processes and Ray substrates) cannot load it. `DriverServer`
serves such callables from the driver instead: it listens on a TCP port, and each connection
(one batch call) is handled in a thread of its thread pool, which calls the function there.
`driver_spec` writes the server's address into a `reward.functions` entry
("driver:<name>#<id>@<host>:<port>/<key>"); `RemoteFunction` is what a worker elsewhere resolves
that entry to, a callable with the function's signature that asks the driver.

The channel carries JSON only (the batch's keyword arguments; the values or an error line back),
never pickles, and each connection proves it holds the entry's random key (HMAC challenge,
`multiprocessing.connection`): a process that has the key can call the reward function with
inputs of its choosing, nothing more. The server lives as long as the driver process.

Not here: checking and weighting the values (`batch_functions.py`), deadlines (the caller's).
"""

from __future__ import annotations

import json
import numbers
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, cast

from asyncrl.rewards.trl_values import call_trl

Lookup = Any  # Callable[[str], Callable[..., Any] | None]; Any keeps this module free of batch_functions


class DriverServer:
    """Serves this process's registered reward callables to reward workers in other processes."""

    def __init__(self, host: str, lookup: Lookup) -> None:
        self.key = secrets.token_hex(16)
        self._lookup = lookup
        self._listener = Listener((host, 0), authkey=self.key.encode())
        self.host, self.port = cast(tuple[str, int], self._listener.address)
        self._threads = ThreadPoolExecutor(thread_name_prefix="asyncrl-driver-reward")
        threading.Thread(target=self._accept, name="asyncrl-driver-reward-accept", daemon=True).start()

    def spec(self, name: str) -> str:
        """`name` (a 'driver:' entry of this process) with this server's address and key."""
        return f"{name.split('@', 1)[0]}@{self.host}:{self.port}/{self.key}"

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):  # no key, or hung up in the handshake
                continue
            self._threads.submit(self._serve, conn)

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                request = json.loads(conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                return
            fn = self._lookup(request["name"])
            try:
                if fn is None:
                    raise LookupError(f"{request['name']} is no longer registered in the driver")
                reply = {"values": to_json(call_trl(fn, request["kwargs"]))}
            except Exception as exc:  # noqa: BLE001 - a user's function may raise anything
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                conn.send_bytes(json.dumps(reply).encode())
            except OSError:
                pass  # the caller gave up (its deadline passed)


def to_json(values: Any) -> Any:
    """The values as JSON carries them: other numbers (numpy's) as floats, anything else as its text
    (for the caller to refuse, as it would refuse the thing itself)."""
    if not isinstance(values, (list, tuple)):
        return repr(values)[:200]
    return [v if v is None or isinstance(v, (bool, int, float)) else float(v) if isinstance(v, numbers.Real)
            else repr(v)[:200] for v in values]


class RemoteFunction:
    """A 'driver:...@host:port/key' entry, callable like the function it names (in the driver)."""

    def __init__(self, spec: str) -> None:
        self.name, _, address = spec.partition("@")
        where, _, key = address.partition("/")
        host, _, port = where.rpartition(":")
        self.address, self.key = (host, int(port)), key.encode()

    def __call__(self, **kwargs: Any) -> Any:
        try:
            payload = json.dumps({"name": self.name, "kwargs": kwargs}).encode()
        except TypeError as exc:
            raise TypeError(f"the batch cannot be sent to the driver as JSON ({exc})") from None
        with Client(self.address, authkey=self.key) as conn:
            conn.send_bytes(payload)
            reply = json.loads(conn.recv_bytes())
        if "error" in reply:
            raise RuntimeError(f"in the driver: {reply['error']}")
        return reply["values"]
