"""cache: one cache directory for the loader, the tiny model's builder and preflight."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.models.cache import cache_dir
from asyncrl.models.loading import local_tokenizer_dir
from asyncrl.models.tiny import load_tiny


def test_asyncrl_cache_wins_over_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    monkeypatch.setenv("ASYNCRL_CACHE", "/some/cache")
    assert cache_dir() == Path("/some/cache")
    monkeypatch.delenv("ASYNCRL_CACHE")
    assert cache_dir() == Path("/xdg/asyncrl")


def test_the_tiny_model_is_found_where_preflight_looks(tiny_cache: Path) -> None:
    """The session's tiny model (built under $ASYNCRL_CACHE) loads from `cache_dir()` without a
    rebuild, and preflight's tokenizer lookup finds it there."""
    assert cache_dir() == tiny_cache
    said: list[str] = []
    load_tiny(log=said.append)
    assert said == []  # "building the tiny model in ..." would mean another cache
    found = local_tokenizer_dir("tiny")
    assert found is not None and found.parent == tiny_cache
