"""A device's out-of-memory error as a message: `out_of_memory_as(where, keys)` turns torch's
CUDA out-of-memory error (`torch.cuda.OutOfMemoryError`, which is `torch.OutOfMemoryError` on
torch >= 2.5) raised inside it into `asyncrl.errors.OutOfMemory`, one line that says where the
device ran out, how much torch asked for, and the config keys that lower the need, the likeliest
first. `asyncrl train` prints it as its one error line and exits 2; the run stops as on any
failure (docs/reliability.md): inside an update nothing is saved, so the newest complete
checkpoint is the one from before.

Used at the workers' boundaries (`workers.trainer.PPOTrainer`, the rollout engine's build and
step), never inside the micro-batch loop. Not here: sizing the budgets (`scheduling.micro_budget`)
or freeing memory after the error (the run stops).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from asyncrl.errors import OutOfMemory

CHECKPOINTING = "set model.enable_gradient_checkpointing=true"
_ASKED = re.compile(r"Tried to allocate [\d.]+ [KMGT]?i?B")


def out_of_memory_message(where: str, keys: Sequence[str], cause: BaseException) -> str:
    """One line: `where` ran out, what torch asked for, then "lower" each of `keys` (which may
    carry their values) or set gradient checkpointing.

    Example: where "the update", keys ("actor.ppo_micro_batch_tokens (now 9216)",
    "rollout.gpu_memory_utilization"), torch's "CUDA out of memory. Tried to allocate 2.00 GiB.
    ..." -> "out of device memory in the update (tried to allocate 2.00 GiB): lower
    actor.ppo_micro_batch_tokens (now 9216) or rollout.gpu_memory_utilization, or set
    model.enable_gradient_checkpointing=true"."""
    asked = _ASKED.search(str(cause))
    detail = f" ({asked.group(0)[0].lower()}{asked.group(0)[1:]})" if asked else ""
    lower = " or ".join([", ".join(keys[:-1]), keys[-1]] if len(keys) > 1 else keys)
    return f"out of device memory in {where}{detail}: lower {lower}, or {CHECKPOINTING}"


@contextmanager
def out_of_memory_as(where: str, keys: Sequence[str]) -> Iterator[None]:
    """Run the block; a CUDA out-of-memory error in it becomes `OutOfMemory` (its message from
    `out_of_memory_message`; the original stays its `__cause__` for `--debug`)."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        raise OutOfMemory(out_of_memory_message(where, keys, exc)) from exc
