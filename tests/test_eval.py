"""`asyncrl eval`: the same metrics as a run's validation (the metrics themselves:
tests/telemetry/test_val_metrics.py), and the command end to end on the tiny model and a small
JSONL file, with its responses as text beside the report (or none with log_val_generations=0)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncrl import cli
from asyncrl.config import load_config
from asyncrl.data import make_task
from asyncrl.data.dataset import write_jsonl
from asyncrl.eval import evaluate
from asyncrl.pipelines.common import run_validation
from asyncrl.telemetry.trace import Trace
from asyncrl.types import Group, PromptRow, Trajectory


class ScriptedRollout:
    """A rollout side whose `generate_scored` hands back a fixed scored group per prompt."""

    def __init__(self, groups: list[Group]) -> None:
        self.groups = {g.row.uid: g for g in groups}

    async def generate_scored(self, row: PromptRow, n: int, uid: str, mode: str = "train") -> Group:
        assert mode == "val" and n == len(self.groups[row.uid].trajectories)
        return self.groups[row.uid]


def test_training_validation_and_eval_report_the_same_numbers() -> None:
    """A run's validation (`run_validation`) and `asyncrl eval` (`evaluate`) over the same scored
    groups: the same keys and the same floats (one function, the groups in the same order, so
    equal to the bit), and best@2 is the expected best (0.75 for rewards [0, 1]), not the
    observed one (1.0). Tolerance: a mean of two float64 values, exact to an ulp."""
    groups = [group("a", "gsm8k", [0, 1]), group("b", "gsm8k", [1, 1]), group("c", "math", [0, 0.5])]
    rows = [g.row for g in groups]
    ctx = SimpleNamespace(val_rows=rows, cfg=load_config(None, ["rollout.val_n=2"]), rollout=ScriptedRollout(groups),
                          trace=Trace(), tokenizer=None)
    training = asyncio.run(run_validation(ctx, step=3))
    evaluated, _ = asyncio.run(evaluate(ScriptedRollout(groups), rows, 2))
    assert {k: v for k, v in training.items() if not k.startswith("timing_s/")} == evaluated
    assert evaluated["val-core/gsm8k/reward/best@2/mean"] == pytest.approx((0.75 + 1) / 2, rel=1e-12, abs=1e-12)
    assert evaluated["val-core/math/reward/best@2/mean"] == pytest.approx(0.5 * 0.75, rel=1e-12, abs=1e-12)


def group(uid: str, source: str, rewards: list[float]) -> Group:
    row = PromptRow(uid=uid, data_source=source, messages=(), ground_truth="")
    trajs = [Trajectory(f"{uid}/{i}", [1], [2] * (i + 1), [0.0] * (i + 1), [0] * (i + 1), "stop", reward=r)
             for i, r in enumerate(rewards)]
    return Group(uid, row, trajs)


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
    lines = [json.loads(x) for x in (tmp_path / "report_generations.jsonl").read_text().splitlines()]
    assert report["generations"] == str(tmp_path / "report_generations.jsonl") and len(lines) == 5 * 4  # all (-1)
    assert {(r["split"], r["step"]) for r in lines} == {("val", 0)} and all(r["prompt"].strip() for r in lines)
    assert sum(r["reward"] for r in lines) / 20 == pytest.approx(m[f"{core}/mean@4"], rel=1e-12, abs=1e-12)


@pytest.mark.slow
def test_asyncrl_eval_on_the_built_in_test_split(tiny_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert cli.main(["--log-level", "WARNING", "eval", "data.val_size=3", "rollout.val_n=2",
                     "data.max_response_length=8", "trainer.log_val_generations=0", f"--out={out}"]) == 0
    report = json.loads(out.read_text())
    assert report["prompts"] == 3 and report["data"] == ["data.task=arithmetic (test split)"]
    assert report["generations"] == "" and not (tmp_path / "report_generations.jsonl").exists()  # 0 = off
    assert "val-core/arithmetic/reward/mean@2" in report["metrics"]


def test_eval_of_a_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["eval", f"data.val_files=[{tmp_path}/nope.jsonl]"]) == 2
    assert capsys.readouterr().err.strip() == f"asyncrl: error: data.val_files: {tmp_path}/nope.jsonl not found"


def test_eval_into_a_path_it_cannot_write_fails_before_generating(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    assert cli.main(["eval", "--out", str(tmp_path / "afile" / "eval.json")]) == 2
    assert capsys.readouterr().err.strip() == (f"asyncrl: error: --out {tmp_path}/afile/eval.json: {tmp_path}/afile "
                                               f"is a file, not a directory; give a writable path")
