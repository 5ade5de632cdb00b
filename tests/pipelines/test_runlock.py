"""One run per run directory: a second run is refused in one line naming the holder, before it
writes anything; a lock left by a killed run is taken over with a line saying so; partial
checkpoint directories are named per writer, and a live writer's is never pruned."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.errors import RunDirBusy
from asyncrl.pipelines.checkpoint import prune, writer_tag
from asyncrl.pipelines.runlock import LOCK_FILE, hold_run_dir
from asyncrl.pipelines.setup import build_context

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from asyncrl.pipelines.runlock import hold_run_dir
    lock = hold_run_dir(Path(sys.argv[1]), print)
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_run_is_refused_before_it_writes_anything(tmp_path):
    lock = hold_run_dir(tmp_path, lambda _: None)
    before = sorted(p.name for p in tmp_path.iterdir())
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}"])
    with pytest.raises(RunDirBusy) as info:
        build_context(cfg, log=lambda _: None)
    message = str(info.value)
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message and "trainer.output_dir" in message
    assert "\n" not in message and sorted(p.name for p in tmp_path.iterdir()) == before == [LOCK_FILE]
    lock.release()
    said: list[str] = []
    hold_run_dir(tmp_path, said.append).release()  # released cleanly: nothing stale to report
    assert said == [] and (tmp_path / LOCK_FILE).read_text() == ""


def test_a_killed_runs_lock_is_taken_over_with_a_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"pid {proc.pid} on {socket.gethostname()}"):
            hold_run_dir(tmp_path, lambda _: None)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    said: list[str] = []
    lock = hold_run_dir(tmp_path, said.append)
    assert len(said) == 1 and f"took over the stale lock of pid {proc.pid}" in said[0]
    assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    lock.release()


def test_partial_checkpoints_are_named_per_writer_and_a_live_writers_is_kept(tmp_path):
    assert writer_tag() == f"{socket.gethostname()}-{os.getpid()}"
    root = tmp_path / "checkpoints"
    live = root / f".global_step_3.partial-{socket.gethostname()}-{os.getppid()}"  # the parent runs
    dead = root / f".global_step_3.partial-{socket.gethostname()}-{dead_pid()}"
    old_style = root / ".global_step_3.partial"
    for path in (live, dead, old_style):
        path.mkdir(parents=True)
    assert sorted(prune(root, keep=0)) == sorted([dead, old_style]) and live.exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_run_directory_modules_load_no_torch():
    """`asyncrl train` runs preflight after importing `rundir` and before torch loads (seconds)."""
    code = "import sys, asyncrl.pipelines.rundir; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
                          ).returncode == 0
