"""Registry lookups, the unknown-data-source message, and user functions from config."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from asyncrl.errors import ConfigError
from asyncrl.rewards.registry import compute_score, known_data_sources, resolve_reward_fn


def test_builtin_names_cover_verl_and_tasks() -> None:
    names = known_data_sources()
    for name in ["openai/gsm8k", "lighteval/MATH", "HuggingFaceH4/MATH-500", "arithmetic",
                 "countdown", "code", "longtail", "apps", "aime*"]:
        assert name in names


def test_unknown_data_source_lists_known_and_config_key() -> None:
    with pytest.raises(ConfigError, match="reward.custom_function") as info:
        resolve_reward_fn("my/dataset")
    assert "openai/gsm8k" in str(info.value) and "my/dataset" in str(info.value)


def test_compute_score_dispatches_by_data_source() -> None:
    assert compute_score("arithmetic", "7", "7", {}) == 1.0
    assert compute_score("longtail", "aa", "aa", {})["score"] == 1.0


def test_custom_function_from_file_and_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = textwrap.dedent('''
        def my_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": float(solution_str == ground_truth), "exact": 1.0}
    ''')
    (tmp_path / "my_reward.py").write_text(src)
    fn = resolve_reward_fn("anything", str(tmp_path / "my_reward.py") + ":my_score")
    assert fn("anything", "x", "x", {}) == {"score": 1.0, "exact": 1.0}
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_reward_fn("anything", "my_reward:my_score")("a", "x", "y", {})["score"] == 0.0


@pytest.mark.parametrize("spec", ["no_colon", "missing_module_xyz:fn", "/no/such/file.py:fn", "json:no_such_fn"])
def test_bad_custom_function_names_config_key(spec: str) -> None:
    with pytest.raises(ConfigError, match="reward.custom_function"):
        resolve_reward_fn("x", spec)
