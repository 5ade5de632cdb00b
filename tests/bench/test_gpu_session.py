"""`bench/gpu_session.sh`, the whole GPU check in one call, run at toy sizes on the CPU (`TINY=1`):
every step runs to `rc=0` (the GPU tests skip) and exactly the eight files the device tool brings
back are left in the output folder. Minutes on the 2-core machine, hence `slow`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["versions", "engine_on", "trainer", "trainer_ab", "gpu_tests", "engine_off", "colocated", "one_step_off"]
FILES = {"gpu.txt", "run.log", "engine_on.json", "trainer.jsonl", "junit.xml", "engine_off.json", "pipelines.json",
         "pipeline_steps.json"}


def test_the_header_names_what_to_send_and_the_one_command() -> None:
    header = (ROOT / "bench" / "gpu_session.sh").read_text().split("set -uo pipefail")[0]
    assert ".whl" in header and ".cache" in header and "\n#   bash bench/gpu_session.sh\n" in header
    assert all(f in header for f in FILES)


@pytest.mark.slow
def test_tiny_window_runs_every_step_and_leaves_the_eight_files(tiny_cache, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), TINY="1", ASYNCRL_CACHE=str(tiny_cache),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("TRITON_INTERPRET", None)  # each step's process sets what it needs
    done = subprocess.run(["bash", "bench/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    log = (out / "run.log").read_text()
    codes = dict(re.findall(r"^== (\S+) rc=(\S+)", log, flags=re.M))
    assert codes == dict.fromkeys(STEPS, "0"), done.stdout[-3000:]
    assert done.returncode == 0
    assert {p.name for p in out.iterdir()} == FILES
    assert "not written" not in "".join((out / f).read_text() for f in FILES - {"run.log"})
