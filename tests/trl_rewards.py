"""TRL-signature reward functions importable by name ('tests.trl_rewards:fn'), for tests that need
one to run in another process (the reward worker's pool)."""

from __future__ import annotations

import os
from typing import Any


def pid_reward(prompts: list[Any], completions: list[Any], pid_log: list[str], **_: Any) -> list[float]:
    """Appends "<pid> <parent pid>" of the process it runs in to the file the `pid_log` column names; 0 each."""
    with open(pid_log[0], "a") as f:
        f.write(f"{os.getpid()} {os.getppid()}\n")
    return [0.0] * len(prompts)
