"""The sandbox interface: run one Python program with stdin under a deadline, get a `RunResult`.

A `Sandbox` runs untrusted, model-written Python. Every backend guarantees the same three
things on every run: a wall-clock kill of everything the run started, a cap on captured output
(past it the run is killed and its status is "output_limit"), and an answer (never a hang, never
an exception for anything the program does). What else a backend contains (files, network,
processes, memory) differs: see `docs/sandbox.md` and each backend's docstring.

Streaming deadlines: a program may mark progress by printing lines that start with `marker`. The
first marked line starts the first step; `step_timeouts_s[k]` then bounds the time until the
(k+1)-th marked line. Local backends enforce these (the code scorer's harness prints one marked
line per finished test, so one slow test is killed at its own timeout) and report the measured
gaps in `step_s`; a remote backend only enforces `timeout_s` and leaves `step_s` empty.

Not here: what a program's output means (`asyncrl.rewards.code_exec`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RunStatus = Literal["ok", "timeout", "output_limit", "killed", "sandbox_error"]
"""ok: exited by itself (any exit code); timeout: killed at a deadline; output_limit: killed for
printing too much; killed: died by a signal we did not send (SIGXCPU, SIGKILL at the memory limit,
its own kill); sandbox_error: the sandbox itself failed (not the program's fault)."""


class SandboxError(RuntimeError):
    """The sandbox could not run a program (bwrap missing or failing, the http service down)."""


@dataclass(frozen=True)
class RunResult:
    status: RunStatus
    """How the run ended."""
    stdout: str = ""
    """Captured standard output (at most the output cap)."""
    stderr: str = ""
    """Captured standard error (shares the output cap with stdout)."""
    exit_code: int | None = None
    """The exit status (negative: killed by that signal); None when unknown (remote, sandbox error)."""
    wall_s: float = 0.0
    """Seconds from start to end, as the parent measured them."""
    step_s: tuple[float, ...] = field(default=())
    """Seconds between consecutive marked stdout lines (local backends; empty for remote ones)."""


class Sandbox(Protocol):
    """Runs untrusted Python source; thread-safe (concurrent `run`s are independent)."""

    name: str

    def run(self, program: str, stdin: str, timeout_s: float, *, marker: str = "",
            step_timeouts_s: Sequence[float] = ()) -> RunResult:
        """Run `program` (Python source) with `stdin`; never raises for what the program does."""
        ...
