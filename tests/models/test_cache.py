"""cache: one cache directory for the loader, the tiny model's builder and preflight; warm-ups whose
arithmetic is pinned, so one spec gives one model on any CPU of a profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.models import cache
from asyncrl.models.cache import cache_dir
from asyncrl.models.loading import local_tokenizer_dir
from asyncrl.models.task_models import COUNTDOWN
from asyncrl.models.tiny import TinySpec, load_tiny
from asyncrl.models.tiny_tools import TinyToolsSpec


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


def test_the_keys_are_pinned_and_hold_the_arithmetic_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny's cache directory name is pinned (tiny-tools and the task models must not move it), and
    every built-in model's key holds the arithmetic its warm-up ran with: another profile, another model."""
    monkeypatch.setattr(cache, "profile", lambda: "x86_64-avx2")
    specs = (TinySpec(), TinyToolsSpec(), COUNTDOWN)
    keys = [s.key() for s in specs]
    assert keys[0] == "tiny-fa3427d82cae"
    monkeypatch.setattr(cache, "profile", lambda: "aarch64")
    assert all(s.key() != k for s, k in zip(specs, keys))


def test_a_build_is_the_same_whatever_the_callers_threads_and_instruction_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds of one spec, one asked from a caller on two threads and ATen's unvectorised
    kernels, give the same weights bit for bit; warmup.json says what they were built with."""
    spec = TinySpec(warmup_max_steps=3, warmup_batch=8)
    threads = torch.get_num_threads()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    try:
        load_tiny(tmp_path / "a", spec, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("OMP_NUM_THREADS")
    load_tiny(tmp_path / "b", spec, log=lambda _: None)
    a, b = (json.loads((tmp_path / d / spec.key() / "warmup.json").read_text()) for d in "ab")
    assert a["weights_sha256"] == b["weights_sha256"] and a["threads"] == b["threads"] == 1
    assert a["profile"] == cache.profile() and a["torch"] == torch.__version__
    if cache.profile() == "x86_64-avx2":
        assert a["cpu_capability"] == "AVX2"


def test_a_failed_build_leaves_nothing_half_built(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="building the model in .* failed"):
        cache.load_or_build(tmp_path / "m", "asyncrl.models.tiny:no_such_builder", TinySpec(), "tiny",
                            log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_a_second_builder_keeps_the_model_that_landed_first(tmp_path: Path) -> None:
    """Two test workers sharing one cache may build the same model at once: the later one's copy is
    dropped, and the first one's stays readable throughout."""
    first, late = tmp_path / "tiny-x", tmp_path / "tiny-x.tmp42"
    for d, text in ((first, "first"), (late, "late")):
        d.mkdir()
        (d / "config.json").write_text(text)
    cache._move_into_place(late, first)
    assert (first / "config.json").read_text() == "first" and not late.exists()
