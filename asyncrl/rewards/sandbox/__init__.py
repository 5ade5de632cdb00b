"""Sandboxes for model-written code: one `Sandbox` interface, backends bwrap | rlimit | http.

Typical use:
    sandbox = make_sandbox(cfg.sandbox)  # auto: bwrap when installed, else rlimit (warns once)
    result = sandbox.run("print(input())", "hi\\n", timeout_s=2.0)  # RunResult(status="ok", stdout="hi\\n")

Reward worker processes get the parent's `SandboxConfig` through the `ASYNCRL_SANDBOX`
environment variable (JSON, set by `RewardPool`); `from_env()` reads it (defaults when unset).
Not here: scoring (`asyncrl.rewards.code_exec`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os

from asyncrl.config.long_tail import SandboxConfig
from asyncrl.rewards.sandbox import bwrap, seccomp
from asyncrl.rewards.sandbox.base import RunResult, RunStatus, Sandbox, SandboxError
from asyncrl.rewards.sandbox.bwrap import BwrapSandbox
from asyncrl.rewards.sandbox.http import HttpSandbox
from asyncrl.rewards.sandbox.rlimit import RlimitSandbox

log = logging.getLogger("asyncrl.sandbox")
ENV_VAR = "ASYNCRL_SANDBOX"
BACKENDS = ("auto", "bwrap", "rlimit", "http")


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """The backend `cfg.backend` names (auto: bwrap if it is installed and works here, else rlimit),
    announced by its start line (a warning where the seccomp filter cannot be installed here)."""
    sandbox = _backend(cfg)
    line = start_line(sandbox.name, cfg)
    log.log(logging.WARNING if "NOT" in line else logging.INFO, line)
    return sandbox


def start_line(backend: str, cfg: SandboxConfig) -> str:
    """What this host's sandbox guarantees, in one line."""
    if backend == "http":
        return f"sandbox: http ({cfg.url}); isolation is the service's"
    tmp = "a private tmpfs /tmp" if backend == "bwrap" else "a fresh temp dir as cwd and TMPDIR"
    missing = seccomp.unavailable()
    guard = "sockets and nested user namespaces refused (seccomp)" if not missing else \
        f"sockets and nested user namespaces NOT refused: {missing}"
    return f"sandbox: {backend}; {tmp} of {cfg.tmp_mb} MiB writable by the program; {guard}"


def _backend(cfg: SandboxConfig) -> Sandbox:
    backend = cfg.backend
    if backend == "auto":
        backend = "bwrap" if bwrap.available() else "rlimit"
    if backend == "bwrap":
        if not bwrap.available():
            raise SandboxError("sandbox.backend=bwrap but bwrap is not installed or cannot create namespaces "
                               "here (apt-get install bubblewrap, or sandbox.backend=auto)")
        return BwrapSandbox(cfg)
    if backend == "rlimit":
        return RlimitSandbox(cfg)
    if backend == "http":
        if not cfg.url:
            raise SandboxError("sandbox.backend=http needs sandbox.url (SandboxFusion's /run_code endpoint)")
        return HttpSandbox(cfg)
    raise SandboxError(f"sandbox.backend={backend!r}: expected one of {', '.join(BACKENDS)}")


def to_env(cfg: SandboxConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg))


def from_env() -> SandboxConfig:
    """The SandboxConfig a RewardPool passed to this process (defaults when none)."""
    raw = os.environ.get(ENV_VAR, "")
    return SandboxConfig(**json.loads(raw)) if raw else SandboxConfig()


@functools.lru_cache(maxsize=4)
def sandbox_for(cfg: SandboxConfig) -> Sandbox:
    """One sandbox per distinct config in this process."""
    return make_sandbox(cfg)


__all__ = ["BACKENDS", "ENV_VAR", "RunResult", "RunStatus", "Sandbox", "SandboxError", "from_env", "make_sandbox",
           "sandbox_for", "start_line", "to_env"]
