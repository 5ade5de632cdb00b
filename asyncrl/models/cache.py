"""Where the built-in models are cached on this machine: one answer for the loader, the tiny
models' builders and preflight; and how a built model lands there (`load_or_build`).

A built-in model is warmed up in a child process (`asyncrl.models.build`) whose arithmetic is
pinned, so that the same spec gives the same weights bit for bit on any CPU of one `profile()`:
one thread, ATen's AVX2 kernels, MKL's conditional numerical reproducibility at AVX2 and oneDNN
capped at AVX2 (`ARITHMETIC_ENV`). Left to themselves, an AVX-512 and an AVX2 machine, or one
thread and two, sum in other orders; the warm-ups stop when a probe crosses a threshold, so the
rounding grew into a differently trained model (tiny-tools' sampled tool calls 0.42 on one CPU
and 0.86 on another) and a fresh machine's learning tests failed on its own warm-up. The profile
is part of each model's cache key (`TinySpec.key` and its siblings); warmup.json records the
torch version, the capability the child ran with and the weights' digest.

Not here: what is cached (`tiny`, `tiny_tools`, `tiny_task`, `loading`), or the Hugging Face hub
cache (`loading.hf_hub_cache`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ARITHMETIC_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The warm-up child's environment on an x86-64 CPU with AVX2 (read by torch and MKL at load)."""


def cache_dir() -> Path:
    """Where built-in models are cached: $ASYNCRL_CACHE, else $XDG_CACHE_HOME/asyncrl (read at
    call time, so a test or a run can point it elsewhere)."""
    root = os.environ.get("ASYNCRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "asyncrl")
    return Path(root)


@cache
def profile() -> str:
    """The arithmetic a warm-up runs with here: "x86_64-avx2" on every x86-64 CPU with AVX2 (the
    pinned `ARITHMETIC_ENV`), else the machine's name (its native kernels, one thread). Read from
    /proc/cpuinfo, without importing torch (the models' keys are computed cheaply)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64") and _has_avx2():
        return "x86_64-avx2"
    return machine or "unknown"


def _has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def arithmetic_env() -> dict[str, str]:
    """The environment variables that pin the warm-up's arithmetic on this profile."""
    if profile() == "x86_64-avx2":
        return dict(ARITHMETIC_ENV)
    return {k: v for k, v in ARITHMETIC_ENV.items() if k.endswith("_NUM_THREADS")}


def load_or_build(path: Path, builder: str, spec: Any, name: str, rebuild: bool = False,
                  log: Callable[[str], None] = print) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer cached at `path`, else built there first: `builder` ("module:function",
    called as `function(spec, log)` and returning (model, tokenizer, warm-up report)) runs in a child
    process with `arithmetic_env()`, which saves the model, tokenizer and report (warmup.json)
    beside `path`; the directory is renamed into place, so a reader never sees half a model. A build
    says so ("building the <name> model in <path> (one time)"), and the child's log lines go to
    `log`. The model comes back in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if rebuild:
        shutil.rmtree(path, ignore_errors=True)
    if not (path / "config.json").exists():
        log(f"building the {name} model in {path} (one time)")
        _build(path, builder, spec, log)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path)


def _build(path: Path, builder: str, spec: Any, log: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    spec_type = f"{type(spec).__module__}:{type(spec).__qualname__}"
    job = json.dumps({"builder": builder, "spec_type": spec_type, "spec": asdict(spec), "out": str(tmp)})
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen([sys.executable, "-m", "asyncrl.models.build"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=errors, text=True,
                                 env={**os.environ, **arithmetic_env()})
        try:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(job)
            child.stdin.close()
            for line in child.stdout:
                log(line.rstrip("\n"))
            if child.wait() != 0:
                errors.seek(0)
                tail = "\n".join(errors.read().strip().splitlines()[-5:])
                raise RuntimeError(f"building the model in {path} failed (exit {child.returncode}):\n{tail}")
        finally:
            if child.poll() is None:  # Ctrl-C or an error here: the build stops with us
                child.kill()
                child.wait()
            if child.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
    _move_into_place(tmp, path)


def _move_into_place(tmp: Path, path: Path) -> None:
    """Rename the built `tmp` to `path`; where another process (a second test worker) got there
    first, keep its copy: the same spec on the same profile is the same model."""
    try:
        tmp.rename(path)
    except OSError:
        if not (path / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
