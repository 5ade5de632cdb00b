"""Checkpoints: `OUTPUT_DIR/checkpoints/global_step_K/` with the actor in Hugging Face format
(loadable by `from_pretrained`), optimizer/scheduler/RNG, critic, and the run state (step,
policy version, prompt-iterator position, pipeline extras such as prompts still in flight).
`latest_checkpointed_iteration.txt` names the newest complete one; it is written last, so a
crash mid-save never points at half a checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from asyncrl.pipelines.setup import RunContext

LATEST = "latest_checkpointed_iteration.txt"


def checkpoint_root(ctx: RunContext) -> Path:
    return ctx.output_dir / "checkpoints"


async def save_checkpoint(ctx: RunContext, step: int, extra: dict[str, Any] | None = None) -> Path:
    root = checkpoint_root(ctx)
    path = root / f"global_step_{step}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    await ctx.trainer.save(path)
    if ctx.tokenizer is not None:  # the simulator has none
        ctx.tokenizer.save_pretrained(path / "actor")
    sync = ctx.synchronizer
    state = {"step": step, "version": sync.version, "behind": sync.behind,
             "prompts": ctx.prompts.state_dict(), "extra": extra or {}}
    (path / "state.json").write_text(json.dumps(state))
    (root / LATEST).write_text(str(step))
    return path


def latest_checkpoint(ctx: RunContext) -> Path | None:
    marker = checkpoint_root(ctx) / LATEST
    if not marker.exists():
        return None
    path = checkpoint_root(ctx) / f"global_step_{marker.read_text().strip()}"
    return path if (path / "state.json").exists() else None


async def load_checkpoint(ctx: RunContext, path: Path) -> dict[str, Any]:
    """Restore the trainer and the run state; the caller then syncs weights to the rollout side."""
    state = json.loads((path / "state.json").read_text())
    await ctx.trainer.load(path)
    ctx.prompts.load_state_dict(state["prompts"])
    return state
