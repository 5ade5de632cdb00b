"""Checkpoints: `OUTPUT_DIR/checkpoints/global_step_K/`, atomic, complete, and pruned.

A checkpoint holds the actor in Hugging Face format (loadable by `from_pretrained`) with its
optimizer, scheduler and RNG state, the critic, and the run state: the update count, the policy
version, the prompt stream with every prompt handed out and not trained (`PromptIterator`), and
the pipeline's own state (`RunContext.pipeline_state`: the fully async pipeline's queue of
finished groups and staleness counters). The run state is taken at one instant, before the first
await, so the weights (which do not change until the next update) and the prompt ledger agree.

Written to `.global_step_K.partial/`, marked `COMPLETE` last, then renamed into place, so a
crash or a full disk mid-save leaves no directory that resume could take for a checkpoint.
`latest_checkpointed_iteration.txt` (verl's marker) then names it, and
`trainer.max_ckpt_to_keep` older complete ones are kept. A resumed run never rewrites the
checkpoint it started from.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.errors import AsyncRLError
from asyncrl.fsutil import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from asyncrl.pipelines.context import RunContext

LATEST = "latest_checkpointed_iteration.txt"
COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"global_step_(\d+)")


class CheckpointError(AsyncRLError, OSError):
    """A checkpoint could not be written (the message names the directory and the cause)."""


def checkpoint_root(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under `root`, oldest first."""
    found = [(int(m.group(1)), p) for p in root.glob("global_step_*")
             if (m := _STEP_DIR.fullmatch(p.name)) and (p / COMPLETE).exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    done = complete_checkpoints(checkpoint_root(output_dir))
    return done[-1] if done else None


def snapshot(ctx: RunContext) -> dict[str, Any]:
    """The run state at this instant (no await): what the next checkpoint will hold."""
    sync = ctx.synchronizer
    return {"step": ctx.step, "trained": ctx.trained, "version": sync.version, "behind": sync.behind,
            "prompts": ctx.prompts.state_dict(),
            "pipeline": ctx.pipeline_state() if ctx.pipeline_state is not None else {}}


async def save_checkpoint(ctx: RunContext, state: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint of the last finished update (`ctx.step`); returns its directory."""
    state = state if state is not None else snapshot(ctx)
    root = checkpoint_root(ctx.output_dir)
    final = root / f"global_step_{state['step']}"
    if ctx.resume_from == final:
        return final  # nothing trained since the run resumed from it
    tmp = root / f".{final.name}.partial"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        await ctx.trainer.save(tmp)
        if ctx.tokenizer is not None:  # the simulator has none
            ctx.tokenizer.save_pretrained(tmp / "actor")
        atomic_write_bytes(tmp / "pipeline.pkl", pickle.dumps(state.pop("pipeline")))
        atomic_write_text(tmp / "state.json", json.dumps(state))
        atomic_write_text(tmp / COMPLETE, "")
        _replace_dir(tmp, final)
        atomic_write_text(root / LATEST, str(state["step"]))
    except Exception as exc:  # a full disk fails in safetensors or torch.save as often as in open()
        shutil.rmtree(tmp, ignore_errors=True)
        last = latest_checkpoint(ctx.output_dir)
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(
            f"could not write the checkpoint of step {state['step']} in {root} ({cause}; "
            f"{_free_mb(root):.0f} MB free); the newest complete checkpoint is {last.name if last else 'none'} "
            "(free space, or set trainer.max_ckpt_to_keep lower)") from exc
    prune(root, ctx.cfg.trainer.max_ckpt_to_keep)
    return final


def _free_mb(path: Path) -> float:
    try:
        return shutil.disk_usage(path).free / 2**20
    except OSError:
        return float("nan")


def _replace_dir(src: Path, dst: Path) -> None:
    """Put `src` at `dst` by renames; an older `dst` (same step, earlier run) is moved aside first."""
    old = dst.with_name(f".{dst.name}.old")
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (0 keeps all), and leftovers of
    saves that never completed; returns what was deleted."""
    done = complete_checkpoints(root)
    doomed = done[:-keep] if keep > 0 else []
    doomed += [p for p in root.glob(".global_step_*") if p.is_dir()]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def load_checkpoint_state(path: Path) -> dict[str, Any]:
    state = json.loads((path / "state.json").read_text())
    pipeline_file = path / "pipeline.pkl"
    state["pipeline"] = pickle.loads(pipeline_file.read_bytes()) if pipeline_file.exists() else {}
    return state


async def load_checkpoint(ctx: RunContext, path: Path) -> dict[str, Any]:
    """Restore the trainer, the prompt stream and the ledger; the caller then pushes the weights
    to the rollout side and hands `state["pipeline"]` to the pipeline."""
    state = load_checkpoint_state(path)
    await ctx.trainer.load(path)
    ctx.prompts.load_state_dict(state["prompts"])
    ctx.step, ctx.trained = state["step"], state["trained"]
    removed = ctx.ledger.rollback(ctx.step)
    if removed:
        ctx.log(f"samples.jsonl: dropped {removed} groups trained after {path.name} (they are trained again)")
    return state
