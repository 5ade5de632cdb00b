"""Checkpoints: `OUTPUT_DIR/checkpoints/global_step_K/` with the actor in Hugging Face format
(loadable by `from_pretrained`), optimizer/scheduler/RNG, critic, and the run state (step,
prompt-iterator position, KL coefficient, pipeline extras). `latest_checkpointed_iteration.txt`
names the newest complete one (written last, so a crash mid-save never points at half a save).
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


def save_checkpoint(ctx: RunContext, step: int, extra: dict[str, Any] | None = None) -> Path:
    root = checkpoint_root(ctx)
    path = root / f"global_step_{step}"
    shutil.rmtree(path, ignore_errors=True)
    ctx.actor.save(path / "actor")
    ctx.tokenizer.save_pretrained(path / "actor")
    if ctx.trainer.critic is not None:
        ctx.trainer.critic.save(path / "critic")
    state = {"step": step, "prompts": ctx.prompts.state_dict(), "kl_coef": ctx.trainer.kl_ctrl.value,
             "counters": ctx.counters, "extra": extra or {}}
    (path / "state.json").write_text(json.dumps(state))
    (root / LATEST).write_text(str(step))
    return path


def latest_checkpoint(ctx: RunContext) -> Path | None:
    marker = checkpoint_root(ctx) / LATEST
    if not marker.exists():
        return None
    path = checkpoint_root(ctx) / f"global_step_{marker.read_text().strip()}"
    return path if (path / "state.json").exists() else None


def load_checkpoint(ctx: RunContext, path: Path) -> dict[str, Any]:
    """Restore actor, critic and run state; push the actor's weights into the engines."""
    state = json.loads((path / "state.json").read_text())
    ctx.actor.load(path / "actor")
    if ctx.trainer.critic is not None:
        ctx.trainer.critic.load(path / "critic")
    ctx.prompts.load_state_dict(state["prompts"])
    ctx.trainer.kl_ctrl.value = state["kl_coef"]
    ctx.counters.update(state["counters"])
    ctx.rollout.load_weights(ctx.actor.named_weights(), ctx.actor.version)
    return state
