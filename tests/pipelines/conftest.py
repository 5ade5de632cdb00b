"""One warmed-up tiny model per test session, built into a temporary cache."""

from __future__ import annotations

import os

import pytest

from asyncrl.models.tiny import load_tiny


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("asyncrl-cache")
    old = os.environ.get("ASYNCRL_CACHE")
    os.environ["ASYNCRL_CACHE"] = str(cache)
    load_tiny(cache, log=lambda _: None)
    yield cache
    if old is None:
        os.environ.pop("ASYNCRL_CACHE", None)
    else:
        os.environ["ASYNCRL_CACHE"] = old


@pytest.fixture(scope="module")
def ray_session(tiny_cache):
    """A Ray cluster for this module, started after ASYNCRL_CACHE is set so workers inherit it."""
    ray = pytest.importorskip("ray")
    yield
    ray.shutdown()
