"""`asyncrl train` in a child process, stopped as a scheduler or a user stops it: SIGTERM saves a
checkpoint and exits 143, a second signal exits at once without touching the last complete
checkpoint, SIGKILL loses at most the work since the last checkpoint. Each run is then resumed
and the ledger shows every prompt trained exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.pipelines.checkpoint import latest_checkpoint, load_checkpoint_state
from tests.pipelines.helpers import read_jsonl, run_pipeline

pytestmark = pytest.mark.slow

RUN = ["pipeline=fully_async", "trainer.val_before_train=false", "trainer.test_freq=0", "rollout.n=4",
       "actor.ppo_mini_batch_size=4", "data.train_batch_size=8", "async_training.staleness_threshold=1.0",
       "trainer.logger=[jsonl]", "num_threads=1"]


def start(out: Path, *extra: str, new_session: bool = False) -> subprocess.Popen[bytes]:
    out.mkdir(parents=True, exist_ok=True)
    log = (out.parent / "train.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "train", *RUN, f"trainer.output_dir={out}",
                             "rollout.total_rollout_steps=4000", *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(), start_new_session=new_session)


def output(out: Path) -> str:
    return (out.parent / "train.log").read_text()


def wait_for(condition, proc: subprocess.Popen[bytes], out: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"train exited {proc.returncode} early: {output(out)[-2000:]}")
        assert time.monotonic() < deadline, "train made no progress"
        time.sleep(0.2)


def steps_logged(out: Path) -> int:
    return len(read_jsonl(out / "metrics.jsonl")) if (out / "metrics.jsonl").exists() else 0


def finish_and_check(out: Path, *extra: str) -> None:
    """Resume (trained so far + 16 prompts) and check that each prompt was trained once."""
    trained = load_checkpoint_state(latest_checkpoint(out))["trained"]
    run_pipeline(out, *RUN, *extra, f"rollout.total_rollout_steps={trained + 16}")
    prompts = Counter(s["prompt"] for s in read_jsonl(out / "samples.jsonl"))
    assert sum(prompts.values()) == trained + 16 and max(prompts.values()) == 1


def test_sigterm_checkpoints_the_last_update_and_exits_143(tiny_cache, tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    wait_for(lambda: steps_logged(out) >= 3, proc, out)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    err = output(out)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    state = load_checkpoint_state(latest_checkpoint(out))
    assert state["step"] >= 3 and len(read_jsonl(out / "samples.jsonl")) == state["trained"]
    finish_and_check(out)


def test_ctrl_c_to_the_whole_group_stops_a_processes_run_in_order(tiny_cache, tmp_path):
    """A terminal's Ctrl-C signals every process of its group: the workers of backend=processes
    live in sessions of their own, so only the driver sees it and stops as with SIGTERM."""
    out = tmp_path / "run"
    processes = ("backend=processes", "rollout.num_cpus=1", "trainer.num_cpus=1")
    proc = start(out, *processes, new_session=True)
    wait_for(lambda: steps_logged(out) >= 2, proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    err = output(out)
    assert proc.returncode == 130, err[-2000:]
    assert "stopped by SIGINT" in err and "Traceback" not in err and "died" not in err
    state = load_checkpoint_state(latest_checkpoint(out))
    assert state["step"] >= 2 and len(read_jsonl(out / "samples.jsonl")) == state["trained"]
    finish_and_check(out, *processes)


def test_sigkill_loses_only_the_work_since_the_last_checkpoint(tiny_cache, tmp_path):
    out = tmp_path / "run"
    proc = start(out, "trainer.save_freq=2")
    wait_for(lambda: latest_checkpoint(out) is not None and steps_logged(out) >= 5, proc, out)
    proc.kill()
    proc.wait(timeout=60)
    finish_and_check(out)


def test_a_second_signal_keeps_the_last_complete_checkpoint(tiny_cache, tmp_path):
    out = tmp_path / "run"
    proc = start(out, "trainer.save_freq=1")
    wait_for(lambda: latest_checkpoint(out) is not None, proc, out)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping generation" in output(out), proc, out)
    proc.send_signal(signal.SIGTERM)  # while the first stop finishes the update and saves (or just after)
    proc.wait(timeout=60)
    assert proc.returncode in (143, -signal.SIGTERM), output(out)[-2000:]
    last = latest_checkpoint(out)
    assert json.loads((last / "state.json").read_text())["step"] >= 1
    finish_and_check(out)
