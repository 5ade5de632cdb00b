"""`asyncrl convert-checkpoint DIR`: rewrite checkpoints of the old pickle format, once.

Checkpoints written before format 2 kept the pipeline's state in `pipeline.pkl` (pickle) and the
optimizer and critic states in `actor/actor_state.pt` and `critic/critic.pt` (`torch.save`, read
with `weights_only=False`): reading them runs whatever code they name, so a run refuses them
(`manifest.refuse_legacy`). This command is the one place that unpickles them, run by a user
who trusts whoever could write the directory: each pickle becomes JSON + safetensors
(`asyncrl.state_io`) beside it and is deleted, then the manifest is written. Run again after an
interruption, it finishes the job. DIR: one checkpoint, or a run directory (each complete
checkpoint in it).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.errors import CheckpointError
from asyncrl.pipelines.checkpoint import PIPELINE_STATE, checkpoint_root
from asyncrl.pipelines.manifest import COMPLETE, MANIFEST, complete_checkpoints, write_manifest
from asyncrl.state_io import save_state
from asyncrl.training.actor import ACTOR_STATE
from asyncrl.training.critic import CRITIC_STATE

_PICKLES = (("pipeline.pkl", PIPELINE_STATE), ("actor/actor_state.pt", f"actor/{ACTOR_STATE}"),
            ("critic/critic.pt", f"critic/{CRITIC_STATE}"))
"""Each old file and the new one it becomes."""


def convert_path(path: Path, log: Callable[[str], None]) -> int:
    """Convert the checkpoint at `path`, or every complete one of the run directory `path`;
    returns how many were converted."""
    ckpts = [path] if (path / COMPLETE).exists() else complete_checkpoints(checkpoint_root(path))
    if not ckpts:
        raise CheckpointError(f"{path}: neither a complete checkpoint nor a run directory with one in "
                              f"{checkpoint_root(path)}")
    return sum(convert_checkpoint(ckpt, log) for ckpt in ckpts)


def convert_checkpoint(ckpt: Path, log: Callable[[str], None]) -> bool:
    """Rewrite one old-format checkpoint in place; False if it was already in the current format."""
    if (ckpt / MANIFEST).exists():
        log(f"{ckpt}: already in the current format")
        return False
    for old, new in _PICKLES:
        if (ckpt / old).exists():
            save_state(_unpickle(ckpt / old), ckpt / new)
            (ckpt / old).unlink()
    write_manifest(ckpt)
    log(f"{ckpt}: converted (JSON + safetensors, {MANIFEST} written)")
    return True


def _unpickle(path: Path) -> Any:
    """The trusted, one-time read of an old pickle (this is what a run never does)."""
    if path.suffix == ".pkl":
        return pickle.loads(path.read_bytes())  # noqa: S301 - the user vouched for this directory
    import torch

    return torch.load(path, weights_only=False, map_location="cpu")  # noqa: S614 - likewise
