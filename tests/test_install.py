"""What `pip install asyncrl` asks of an environment: torch as a lower bound that the package
checks at import (so a user's CUDA torch is kept), Ray only through the `ray` extra."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import asyncrl
from asyncrl.config import load_config
from asyncrl.errors import ConfigError
from asyncrl.substrates.registry import substrate_for

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def requirement(name: str, extra: str | None = None) -> str:
    reqs = PYPROJECT["optional-dependencies"][extra] if extra else PYPROJECT["dependencies"]
    return next(r for r in reqs if re.split(r"[<>=!~\[ ;]", r)[0] == name)


def test_torch_is_a_lower_bound_equal_to_the_one_checked_at_import() -> None:
    assert requirement("torch") == "torch>=" + ".".join(map(str, asyncrl.MIN_TORCH))


@pytest.mark.parametrize(("version", "ok"), [("2.13.0+cpu", True), ("2.4.0", True), ("2.4.0a0+git1234", True),
                                              ("10.0", True), ("2.3.1+cu121", False), ("1.13.1", False)])
def test_check_torch(version: str, ok: bool) -> None:
    if ok:
        asyncrl.check_torch(version)
    else:
        with pytest.raises(ImportError, match=r"asyncrl needs torch>=2\.4, found torch .*pip install 'torch>=2\.4'"):
            asyncrl.check_torch(version)


@pytest.mark.parametrize(("version", "parts", "expected"), [("2.11.0+cu130", 2, (2, 11)), ("2.4.0a0+git1", 2, (2, 4)),
                                                            ("2.13.0", 3, (2, 13, 0)), ("10.0", 2, (10, 0))])
def test_versions_compare_as_tuples(version: str, parts: int, expected: tuple[int, ...]) -> None:
    assert asyncrl.version_tuple(version, parts) == expected
    assert asyncrl.version_tuple("2.11.0") > asyncrl.version_tuple("2.5")  # as strings, "2.11" < "2.5"


def test_the_prefill_uses_grouped_sdpa_on_this_torch() -> None:
    """torch 2.13 has `enable_gqa` (2.5+): padded prefills and prefix-cache hits do not repeat K/V heads."""
    from asyncrl.rollout import prefill

    assert asyncrl.torch_at_least(2, 5) and prefill._SDPA_GQA


def test_ray_is_an_extra() -> None:
    assert not any(r.startswith("ray") for r in PYPROJECT["dependencies"])
    assert requirement("ray", "ray").startswith("ray>=")
    assert {"ray", "wandb", "peft", "bench", "test"} <= PYPROJECT["optional-dependencies"].keys()


def test_backend_ray_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^backend=ray needs Ray, which is not installed: pip install 'asyncrl.ray"):
        substrate_for(load_config(None, ["backend=ray"]))


def test_the_build_declares_its_license_as_spdx_with_a_setuptools_that_reads_it() -> None:
    """A `license = {text = ...}` table is deprecated since setuptools 77 (the pip build warned)."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["build-system"]["requires"] == ["setuptools>=77"]
    assert not any("License ::" in c for c in project["project"].get("classifiers", []))
