"""`asyncrl eval`: verl's validation metrics against hand-computed numbers and verl's bootstrap,
and the command end to end on the tiny model and a small JSONL file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asyncrl import cli
from asyncrl.data import make_task
from asyncrl.data.dataset import write_jsonl
from asyncrl.eval import best_of, eval_metrics, pass_at, prompt_metrics, sizes
from asyncrl.types import Group, PromptRow, Trajectory


def test_prompt_metrics_by_hand() -> None:
    m = prompt_metrics([1.0, 0.0, 0.0, 1.0])  # n = 4, two pass
    expected = {"mean@4": 0.5, "std@4": 0.5,
                "best@2/mean": 0.75, "best@2/std": 0.75**0.5 * 0.5,
                "worst@2/mean": 0.25, "worst@2/std": 0.75**0.5 * 0.5,
                "best@4/mean": 1 - 0.5**4, "best@4/std": (0.9375 * 0.0625) ** 0.5,
                "worst@4/mean": 0.5**4, "worst@4/std": (0.9375 * 0.0625) ** 0.5,
                "pass@1": 0.5, "pass@2": 1 - 1 / 6, "pass@4": 1.0}
    assert m.keys() == expected.keys()
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k


def test_partial_scores_and_odd_n() -> None:
    assert sizes(1) == [] and sizes(3) == [2, 3] and sizes(8) == [2, 4, 8] and sizes(10) == [2, 4, 8, 10]
    # sorted [0.1, 0.1, 1.0]: the best of 3 draws is 1.0 unless all three miss it, (2/3)^3
    assert best_of([0.1, 1.0, 0.1], 3)[0] == pytest.approx(0.1 * 8 / 27 + 19 / 27, rel=1e-12, abs=1e-12)
    assert pass_at([0.1, 1.0, 0.1], 1) == pytest.approx(1 / 3, rel=1e-12, abs=1e-12)
    assert pass_at([0.1, 1.0, 0.1], 2) == pytest.approx(2 / 3, rel=1e-12, abs=1e-12)
    assert prompt_metrics([0.7]) == {"mean@1": 0.7, "pass@1": 0.0}


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0], [0.2, 0.9, 0.4]])
def test_best_and_worst_match_verls_bootstrap(rewards: list[float]) -> None:
    """verl draws 1,000 subsets with replacement (`bootstrap_metric`); ours is that draw's expectation."""
    rng = np.random.RandomState(42)
    for m in sizes(len(rewards)):
        draws = np.array(rewards)[rng.choice(len(rewards), size=(20_000, m), replace=True)]
        mean, std = best_of(rewards, m)
        assert mean == pytest.approx(draws.max(axis=1).mean(), rel=0, abs=0.01)
        assert std == pytest.approx(draws.max(axis=1).std(), rel=0, abs=0.01)


def group(uid: str, source: str, rewards: list[float]) -> Group:
    row = PromptRow(uid=uid, data_source=source, messages=(), ground_truth="")
    trajs = [Trajectory(f"{uid}/{i}", [1], [2] * (i + 1), [0.0] * (i + 1), [0] * (i + 1), "stop", reward=r)
             for i, r in enumerate(rewards)]
    return Group(uid, row, trajs)


def test_eval_metrics_names_and_split() -> None:
    out = eval_metrics([group("a", "gsm8k", [1, 0, 0, 1]), group("b", "gsm8k", [0, 0, 0, 0]),
                        group("c", "math", [1, 1, 1, 1])])
    assert out["val-core/gsm8k/reward/mean@4"] == pytest.approx(0.25, rel=1e-12, abs=1e-12)
    assert out["val-core/gsm8k/reward/best@4/mean"] == pytest.approx(0.9375 / 2, rel=1e-12, abs=1e-12)
    assert out["val-core/gsm8k/reward/best@4/std"] == pytest.approx((0.9375 * 0.0625) ** 0.5 / 2, rel=1e-12, abs=1e-12)
    assert out["val-core/gsm8k/reward/pass@4"] == 0.5 and out["val-aux/gsm8k/reward/pass@1"] == 0.25
    assert out["val-aux/gsm8k/reward/best@2/mean"] == pytest.approx(0.375, rel=1e-12, abs=1e-12)
    assert "val-aux/gsm8k/reward/worst@4/mean" in out and "val-aux/gsm8k/reward/std@4" in out
    assert out["val-core/math/reward/mean@4"] == 1.0
    assert out["val/score/mean"] == pytest.approx(0.5, rel=1e-12, abs=1e-12)
    assert out["val/pass@4"] == pytest.approx(2 / 3, rel=1e-12, abs=1e-12)
    assert out["val/response_length/mean"] == 2.5


@pytest.mark.slow
def test_asyncrl_eval_on_a_jsonl_file(tiny_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "val.jsonl"
    write_jsonl(make_task("arithmetic", 5, seed=3, split="test"), str(data))
    out = tmp_path / "report.json"
    assert cli.main(["eval", "model.path=tiny", f"data.val_files=[{data}]", "rollout.val_n=4",
                     "data.max_response_length=8", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    m = report["metrics"]
    assert report["n"] == 4 and report["prompts"] == 5 and report["data"] == [str(data)]
    core = "val-core/arithmetic/reward"
    assert {f"{core}/mean@4", f"{core}/best@4/mean", f"{core}/pass@4", "val/pass@4"} <= m.keys()
    assert 0 <= m["val-aux/arithmetic/reward/worst@4/mean"] <= m[f"{core}/mean@4"] <= m[f"{core}/best@4/mean"] <= 1
    assert m["val-aux/arithmetic/reward/pass@1"] <= m["val-aux/arithmetic/reward/pass@2"] <= m[f"{core}/pass@4"]
    table = capsys.readouterr().out
    assert table.splitlines()[1].startswith(f"{core}/") and f"{m[f'{core}/mean@4']:.4f}" in table


@pytest.mark.slow
def test_asyncrl_eval_on_the_built_in_test_split(tiny_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert cli.main(["--log-level", "WARNING", "eval", "data.val_size=3", "rollout.val_n=2",
                     "data.max_response_length=8", f"--out={out}"]) == 0
    report = json.loads(out.read_text())
    assert report["prompts"] == 3 and report["data"] == ["data.task=arithmetic (test split)"]
    assert "val-core/arithmetic/reward/mean@2" in report["metrics"]


def test_eval_of_a_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["eval", f"data.val_files=[{tmp_path}/nope.jsonl]"]) == 2
    assert capsys.readouterr().err.strip() == f"asyncrl: error: data.val_files: {tmp_path}/nope.jsonl not found"
