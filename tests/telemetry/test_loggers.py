"""Metric sinks write what a user opens (JSONL lines, TensorBoard event files, a W&B run), and a
run resumed from step K's checkpoint continues them: steps past K the interrupted run logged are
replaced, not duplicated, and W&B reopens the same run."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from asyncrl.telemetry.loggers import WANDB_ID_FILE, make_tracker


def tracker(tmp_path, names, initial_step=0, log=print):
    return make_tracker(names, tmp_path, total_steps=10, initial_step=initial_step, project="p",
                        experiment="e", config={"lr": 1e-6}, log=log)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_and_tensorboard(tmp_path):
    t = tracker(tmp_path, ["jsonl", "tensorboard"])
    t.log({"critic/score/mean": 0.5, "timing_s/step": 1.0}, 1)
    t.log({"critic/score/mean": float("nan")}, 2)
    t.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.0}, {"step": 2, "critic/score/mean": None}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_jsonl_resume_drops_steps_after_the_checkpoint(tmp_path):
    t = tracker(tmp_path, ["jsonl"])
    for step in range(0, 6):
        t.log({"x": float(step)}, step)
    t.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "x"')  # torn by the crash
    lines: list[str] = []
    t = tracker(tmp_path, ["jsonl"], initial_step=3, log=lines.append)
    t.log({"x": 40.0}, 4)
    t.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 0, "x": 0.0}, {"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}, {"step": 3, "x": 3.0},
        {"step": 4, "x": 40.0}]
    assert len(lines) == 1 and "dropped 2 later records and 1 unreadable lines" in lines[0]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_jsonl_fresh_run_appends(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 5, "x": 1.0}\n')
    t = tracker(tmp_path, ["jsonl"])
    t.log({"x": 2.0}, 1)
    t.close()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 5, "x": 1.0}, {"step": 1, "x": 2.0}]


def tensorboard_scalars(logdir, tag):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def log_steps(tmp_path, steps, initial_step=0, value=0.0):
    t = tracker(tmp_path, ["tensorboard"], initial_step=initial_step)
    for step in steps:
        t.log({"x": value + step}, step)
    t.close()


def test_tensorboard_resume_purges_steps_after_the_checkpoint(tmp_path):
    log_steps(tmp_path, range(1, 6))
    log_steps(tmp_path, [], initial_step=3)  # resumed, nothing logged yet: 4 and 5 are already gone
    assert tensorboard_scalars(tmp_path / "tensorboard", "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    log_steps(tmp_path, [4], initial_step=3, value=100.0)
    assert tensorboard_scalars(tmp_path / "tensorboard", "x") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0)]


class FakeWandbRun:
    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.logged: list[tuple[dict[str, float], int]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((metrics, step))

    def finish(self) -> None:
        pass


@pytest.fixture
def fake_wandb(monkeypatch):
    """A `wandb` module whose `init` records its kwargs and hands out run ids run-0, run-1, ..."""
    module: Any = types.ModuleType("wandb")
    module.inits = []

    def init(**kwargs: Any) -> FakeWandbRun:
        module.inits.append(kwargs)
        return FakeWandbRun(kwargs.get("id") or f"run-{len(module.inits) - 1}")

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_resume_reopens_the_same_run(tmp_path, fake_wandb):
    t = tracker(tmp_path, ["wandb"])
    t.log({"x": 1.0}, 1)
    t.close()
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == "run-0"
    assert "id" not in fake_wandb.inits[0] and "resume" not in fake_wandb.inits[0]
    tracker(tmp_path, ["wandb"], initial_step=1).close()
    assert fake_wandb.inits[1] == {"project": "p", "name": "e", "config": {"lr": 1e-6},
                                  "dir": str(tmp_path), "id": "run-0", "resume": "allow"}


def test_wandb_fresh_run_in_a_used_directory_starts_a_new_run(tmp_path, fake_wandb):
    (tmp_path / WANDB_ID_FILE).write_text("old\n")
    tracker(tmp_path, ["wandb"]).close()
    assert "id" not in fake_wandb.inits[0]
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == "run-0"


def test_wandb_resume_without_a_stored_id_starts_a_new_run(tmp_path, fake_wandb):
    tracker(tmp_path, ["wandb"], initial_step=4).close()
    assert "id" not in fake_wandb.inits[0]
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == "run-0"


@pytest.fixture
def fake_mlflow(monkeypatch):
    """An `mlflow` module that records what the sink asks of it."""
    module: Any = types.ModuleType("mlflow")
    module.calls = []
    for name in ("set_tracking_uri", "set_experiment", "start_run", "log_params", "log_metrics", "end_run"):
        setattr(module, name, lambda *a, _name=name, **k: module.calls.append((_name, a, k)))
    monkeypatch.setitem(sys.modules, "mlflow", module)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return module


def test_mlflow_logs_to_a_file_store_in_the_run_directory(tmp_path, fake_mlflow):
    t = tracker(tmp_path, ["mlflow"])
    t.log({"critic/score/mean": 0.5, "actor/pg_loss": float("nan")}, 3)
    t.close()
    calls = {name: (a, k) for name, a, k in fake_mlflow.calls}
    assert calls["set_tracking_uri"][0] == ((tmp_path / "mlruns").resolve().as_uri(),)
    assert calls["start_run"][1] == {"run_name": "e"}
    assert calls["log_params"][0] == ({"lr": "1e-06"},)
    assert calls["log_metrics"] == (({"critic/score/mean": 0.5},), {"step": 3})  # non-finite values dropped
    assert [name for name, _, _ in fake_mlflow.calls][-1] == "end_run"


def test_swanlab_run_gets_the_metrics_and_finishes(tmp_path, monkeypatch):
    module: Any = types.ModuleType("swanlab")
    module.inits = []

    def init(**kwargs: Any) -> FakeWandbRun:
        module.inits.append(kwargs)
        return module.run

    module.run, module.init = FakeWandbRun("s"), init
    monkeypatch.setitem(sys.modules, "swanlab", module)
    t = tracker(tmp_path, ["swanlab"])
    t.log({"x": 1.0}, 2)
    t.close()
    assert module.inits == [{"project": "p", "experiment_name": "e", "config": {"lr": 1e-6},
                             "logdir": str(tmp_path / "swanlog")}]
    assert module.run.logged == [({"x": 1.0}, 2)]
