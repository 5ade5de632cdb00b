"""bench/pipelines.py survives what broke it on the first GPU run: each configuration in a fresh
directory with resume off, a run that times out killed with its whole process group (children
too), a run that fails or trains nothing recorded with its stderr's tail while the next one runs,
and the results file rewritten after every configuration. Fake runs (a Python child standing in
for `asyncrl train`), then one real tiny run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import pipelines

FAKE_TRAIN = r"""
import json, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
mode = next(a for a in sys.argv if a.startswith("mode=")).split("=")[1]
(out / "argv.json").write_text(json.dumps(sys.argv))
if mode == "hang":  # a run that ignores SIGTERM and has a child of its own
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (out / "child.pid").write_text(str(child.pid))
    print("hanging on purpose", file=sys.stderr, flush=True)
    time.sleep(120)
steps = 2 if mode == "ok" else 0
with (out / "metrics.jsonl").open("w") as f:
    for step in range(1, steps + 1):
        f.write(json.dumps({"step": step, "timing_s/step": 0.5, "training/responses": 8}) + "\n")
if mode == "crash":
    sys.exit("Traceback: the run broke")
"""
FAKES = {"ok": ["mode=ok"], "empty": ["mode=empty"], "crash": ["mode=crash"], "hang": ["mode=hang"]}


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as dead)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture
def fake_runs(monkeypatch):
    monkeypatch.setattr(pipelines, "CONFIGS", FAKES)
    monkeypatch.setattr(pipelines, "train_command",
                        lambda out, overrides: [sys.executable, "-c", FAKE_TRAIN, str(out), *overrides])


def test_failed_and_stuck_runs_are_recorded_and_the_next_configuration_runs(fake_runs, tmp_path):
    args = pipelines.parse(["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "res.json"),
                            "--timeout-s", "3"])
    (tmp_path / "runs").mkdir()
    results = pipelines.run_all(args, tmp_path / "runs")
    saved = json.loads((tmp_path / "res.json").read_text())
    assert [r["config"] for r in results] == [r["config"] for r in saved["results"]] == ["ok"]
    assert saved["results"][0]["trained_responses"] == 16 and saved["results"][0]["samples_per_s"] == 16.0
    failed = {f["config"]: f for f in saved["failed"]}
    assert failed["empty"]["error"] == "trained nothing (0 steps logged)"
    assert failed["crash"]["error"] == "exit status 1"
    assert failed["crash"]["stderr_tail"] == ["Traceback: the run broke"]
    assert failed["hang"]["error"] == "timed out after 3 s"
    assert failed["hang"]["stderr_tail"] == ["hanging on purpose"]
    child = int((Path(failed["hang"]["run_dir"]) / "child.pid").read_text())
    assert not alive(child), "the stuck run's own child outlived it"


def test_every_configuration_gets_a_fresh_directory_and_never_resumes(fake_runs, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    dirs = []
    for i in range(2):  # the same --runs-dir twice, as two GPU-session steps did
        args = pipelines.parse(["--runs-dir", str(root), "--out", str(tmp_path / f"res{i}.json"), "--only", "ok"])
        dirs += [Path(r["run_dir"]) for r in pipelines.run_all(args, root)]
    assert len(set(dirs)) == 2 and all(d.parent == root for d in dirs)
    for d in dirs:
        assert "trainer.resume_mode=disable" in json.loads((d / "argv.json").read_text())


def test_merged_invocations_fill_one_results_file_and_keep_each_runs_steps(fake_runs, tmp_path, monkeypatch):
    """The GPU session runs colocated, then one_step_off, as separate invocations into one file;
    a failed run's steps are kept too, and the invocation whose configuration failed exits 1."""
    out, steps = tmp_path / "res.json", tmp_path / "steps.json"
    codes = []
    for only in ("ok", "crash"):
        argv = ["--runs-dir", str(tmp_path), "--out", str(out), "--only", only, "--merge", "--steps-out", str(steps)]
        monkeypatch.setattr(sys, "argv", ["pipelines.py", *argv])
        with pytest.raises(SystemExit) as stopped:
            pipelines.main()
        codes.append(stopped.value.code)
    saved = json.loads(out.read_text())
    assert codes == [0, 1]
    assert [r["config"] for r in saved["results"]] == ["ok"] and [f["config"] for f in saved["failed"]] == ["crash"]
    ok = [{"step": 1, "timing_s/step": 0.5}, {"step": 2, "timing_s/step": 0.5}]
    assert json.loads(steps.read_text()) == {"ok": ok, "crash": []}


def test_the_budget_is_passed_only_when_asked():
    assert not any("ppo_micro_batch_tokens" in o for o in pipelines.common(pipelines.parse([])))
    asked = pipelines.common(pipelines.parse(["--micro-tokens", "8192", "--override", "model.dtype=float32"]))
    assert "actor.ppo_micro_batch_tokens=8192" in asked and asked[-1] == "model.dtype=float32"


@pytest.mark.slow
def test_a_real_tiny_run_trains_with_resume_off(tiny_cache, tmp_path):
    """`asyncrl train` itself: it takes the bench's keys (resume off) and its metrics give the result."""
    root = tmp_path / "runs"
    root.mkdir()
    args = pipelines.parse(["--steps", "1", "--prompts", "2", "--n", "2", "--max-len", "8", "--runs-dir", str(root),
                            "--only", "colocated", "--out", str(tmp_path / "res.json"), "--timeout-s", "300"])
    results = pipelines.run_all(args, root)
    assert json.loads((tmp_path / "res.json").read_text())["failed"] == []
    assert [(r["steps"], r["trained_responses"]) for r in results] == [(1, 4)]  # 2 prompts x 2


def test_group_members_lists_a_groups_live_processes_and_not_its_zombies():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert pipelines.group_members(proc.pid) == [proc.pid]
    finally:
        proc.kill()
    pipelines.wait_group_gone(proc.pid)  # a zombie until reaped below: not a member any more
    assert pipelines.group_members(proc.pid) == []
    proc.wait()
