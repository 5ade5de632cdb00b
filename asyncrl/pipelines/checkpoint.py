"""Checkpoints: `OUTPUT_DIR/checkpoints/global_step_K/`, atomic, complete, verified and pruned.

A checkpoint holds the actor in Hugging Face format (loadable by `from_pretrained`) with its
optimizer, scheduler and RNG state, the critic, and the run state: the update count, the policy
version, the prompt stream with every prompt handed out and not trained (`PromptIterator`), and
the pipeline's own state (`RunContext.pipeline_state`: the fully async pipeline's queue of
finished groups and staleness counters). The run state is taken at one instant, before the first
await, so the weights (which do not change until the next update) and the prompt ledger agree.
Every file is JSON or safetensors (`asyncrl.state_io`): nothing a resume reads can run code.

Written to `.global_step_K.partial-HOST-PID/` (unique per writer), its files listed with their
sizes and sha256 in `manifest.json` (`asyncrl.pipelines.manifest`), marked `COMPLETE` last, then
renamed into place, so a crash or a full disk mid-save leaves no directory that resume could take
for a checkpoint, and resume can tell a damaged one (it falls back to the previous).
`latest_checkpointed_iteration.txt` (verl's marker) then names it, and
`trainer.max_ckpt_to_keep` older complete ones are kept. A resumed run never rewrites the
checkpoint it started from.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.errors import AsyncRLError, CheckpointError
from asyncrl.fsutil import atomic_write_text
from asyncrl.pipelines.manifest import COMPLETE, complete_checkpoints, write_manifest
from asyncrl.pipelines.runlock import pid_alive

if TYPE_CHECKING:
    from asyncrl.pipelines.context import RunContext

__all__ = ["COMPLETE", "CheckpointError", "complete_checkpoints", "latest_checkpoint", "load_checkpoint",
           "load_checkpoint_state", "prune", "save_checkpoint", "snapshot"]
LATEST = "latest_checkpointed_iteration.txt"
PIPELINE_STATE = "pipeline.json"
"""The pipeline's own state (its tensors, if any, beside it in pipeline.safetensors)."""
_INLINE_HASH_BYTES = 64 << 20


def checkpoint_root(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def writer_tag() -> str:
    """This process among all writers of a shared run directory: `HOST-PID`."""
    return f"{socket.gethostname()}-{os.getpid()}"


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
    from asyncrl.state_io import save_state  # torch: not for `asyncrl train`'s preflight, which imports this module

    state = state if state is not None else snapshot(ctx)
    root = checkpoint_root(ctx.output_dir)
    final = root / f"global_step_{state['step']}"
    if ctx.resume_from == final:
        return final  # nothing trained since the run resumed from it
    tmp = root / f".{final.name}.partial-{writer_tag()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        await ctx.trainer.save(tmp)
        if ctx.tokenizer is not None:  # the simulator has none
            ctx.tokenizer.save_pretrained(tmp / "actor")
        save_state(state.pop("pipeline"), tmp / PIPELINE_STATE)
        atomic_write_text(tmp / "state.json", json.dumps(state))
        await _write_manifest(tmp)
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


async def _write_manifest(ckpt: Path) -> None:
    """Hash a large checkpoint off the event loop (rollouts go on meanwhile); a small one (the
    tiny model's ~40 MB hash in ~0.1 s, the simulator's in microseconds, on a virtual clock that
    no thread may wake) here."""
    if sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) < _INLINE_HASH_BYTES:
        write_manifest(ckpt)
    else:
        await asyncio.to_thread(write_manifest, ckpt)


def _free_mb(path: Path) -> float:
    try:
        return shutil.disk_usage(path).free / 2**20
    except OSError:
        return float("nan")


def _replace_dir(src: Path, dst: Path) -> None:
    """Put `src` at `dst` by renames; an older `dst` (same step, earlier run) is moved aside first."""
    old = dst.with_name(f".{dst.name}.old-{writer_tag()}")
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (0 keeps all), and leftovers of
    saves that never completed (not those of a writer still running on this host); returns what
    was deleted."""
    done = complete_checkpoints(root)
    doomed = done[:-keep] if keep > 0 else []
    doomed += [p for p in root.glob(".global_step_*") if p.is_dir() and not _live_writer(p.name)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _live_writer(name: str) -> bool:
    """A partial or set-aside directory (`...-HOST-PID`) of another process still running here."""
    host, _, pid = name.rpartition("-")
    return (host.endswith(f"-{socket.gethostname()}") and pid.isdigit() and int(pid) != os.getpid()
            and pid_alive(int(pid)))


def load_checkpoint_state(path: Path) -> dict[str, Any]:
    """The run state of checkpoint `path` (JSON only; a pickle beside it is never opened)."""
    from asyncrl.state_io import load_state, read_json

    state = read_json(path / "state.json")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path / 'state.json'} is not a run state; the checkpoint is damaged")
    pipeline_file = path / PIPELINE_STATE
    state["pipeline"] = load_state(pipeline_file) if pipeline_file.exists() else {}
    return state


async def load_checkpoint(ctx: RunContext, path: Path) -> dict[str, Any]:
    """Restore the trainer, the prompt stream and the ledger; the caller then pushes the weights
    to the rollout side and hands `state["pipeline"]` to the pipeline."""
    state = load_checkpoint_state(path)
    try:
        await ctx.trainer.load(path)
    except AsyncRLError:  # CheckpointError (a damaged file), a dead worker, ...
        raise
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as exc:  # a crafted file its manifest vouches for
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:200]})") from exc
    ctx.prompts.load_state_dict(state["prompts"])
    ctx.step, ctx.trained = state["step"], state["trained"]
    removed = ctx.ledger.rollback(ctx.step)
    if removed:
        ctx.log(f"samples.jsonl: dropped {removed} groups trained after {path.name} (they are trained again)")
    return state
