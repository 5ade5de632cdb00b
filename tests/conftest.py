"""Shared test setup.

- One torch thread (the CI machine has 2 cores shared with others).
- Without CUDA, Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before
  anything imports triton).
- Offline: a test that opens a network connection to anything but this machine fails
  (`no_network`); Ray is started on the loopback address for that reason.
- One warmed-up tiny model (`tiny_cache`; `tiny_tools_cache` for tiny-tools) per pytest worker
  and one Ray cluster (`ray_cluster`) per test run: `./run.sh test` runs two xdist workers, and
  the tests on Ray all go to one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
if not torch.cuda.is_available():
    # Triton kernels run interpreted over CPU tensors. Set before any test module imports triton:
    # `triton.jit` reads it when it decorates, and triton.language's own functions (tl.sum, ...)
    # are decorated when triton is first imported (transformers' Llama imports it).
    os.environ["TRITON_INTERPRET"] = "1"

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_local(address: object) -> None:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like
        return
    host = str(address[0])
    if host in ("localhost", ""):
        return
    try:
        if ipaddress.ip_address(host.split("%")[0]).is_loopback:
            return
    except ValueError:
        pass
    raise RuntimeError(f"tests run offline: a connection to {address!r} was attempted")


def _guarded_connect(self: socket.socket, address: object) -> None:
    _check_local(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    _check_local(address)
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def no_network():
    """Every test: sockets may connect to loopback only."""
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    yield
    socket.socket.connect, socket.socket.connect_ex = _real_connect, _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """The built-in models' cache of this test run ($ASYNCRL_CACHE while it lasts): a temporary
    directory, or $ASYNCRL_TEST_CACHE where that is set (a GPU session carries it: no rebuild there)."""
    cache = Path(os.environ["ASYNCRL_TEST_CACHE"]) if os.environ.get("ASYNCRL_TEST_CACHE") else \
        tmp_path_factory.mktemp("asyncrl-cache")
    old = os.environ.get("ASYNCRL_CACHE")
    os.environ["ASYNCRL_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("ASYNCRL_CACHE", None)
    else:
        os.environ["ASYNCRL_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_cache(model_cache):
    """The tiny model, built and warmed up once per test run (or once for good) in `model_cache`."""
    from asyncrl.models.tiny import load_tiny

    load_tiny(model_cache, log=lambda _: None)
    return model_cache


@pytest.fixture(scope="session")
def tiny_tools_cache(model_cache):
    """The tiny-tools model, built and warmed up once per test run (or once for good) in `model_cache`."""
    from asyncrl.models.tiny_tools import load_tiny_tools

    load_tiny_tools(model_cache, log=lambda _: None)
    return model_cache


def start_ray() -> None:
    from asyncrl.workers.ray_host import init_ray

    init_ray(num_cpus=4, log_to_driver=False, node_ip="127.0.0.1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the groups into node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`./run.sh test` runs two pytest-xdist workers (`--dist loadgroup`): every test on Ray goes
    to the same one, in file order, so one Ray cluster serves them all (test_ray_host's last test
    restarts it) and two clusters never compete for the machine's cores. The tests of the
    tiny-tools model go to one worker too, so it is warmed up once. pytest is held below 9.2, where
    xdist 3.8's grouping silently stops (pytest-xdist#1386; tests/test_xdist_groups.py checks it)."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif "tiny_tools_cache" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("tiny_tools"))


@pytest.fixture(scope="session")
def ray_cluster(tiny_cache):
    """One local Ray cluster for the whole run, started after ASYNCRL_CACHE is set (its workers
    inherit it)."""
    ray = pytest.importorskip("ray")
    start_ray()
    yield ray
    ray.shutdown()
