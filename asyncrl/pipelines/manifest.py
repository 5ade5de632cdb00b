"""What a checkpoint holds, verified: every file's size and sha256 in `manifest.json`, and the
choice of the checkpoint a run resumes from.

`write_manifest(dir)` lists every file of a checkpoint being written (all but the manifest and the
`COMPLETE` marker), last, before the directory is renamed into place. `damage(dir)` reads the
files back against it and says what is wrong in a few words (a missing file, a size, a
checksum), or None. `resume_point(run_dir)` walks the complete checkpoints newest first: a damaged
one is reported in one line and set aside as `global_step_K.damaged` (kept for a look, never
resumed or pruned), and the next older one is tried; none left is a one-line `CheckpointError`
naming them all. A checkpoint of the old format (pickles: `pipeline.pkl`, `actor_state.pt`,
`critic.pt`, no manifest) is refused in one line naming `asyncrl convert-checkpoint`.

The checksums find damage (a torn copy, a bad disk, a truncated file), not a forger: whoever can
write the directory can rewrite the manifest too. That case is covered by the formats: nothing a
resume reads can run code (`asyncrl.state_io`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asyncrl.errors import CheckpointError
from asyncrl.fsutil import atomic_write_text

MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
FORMAT = 2
"""Checkpoint format: 2 = JSON + safetensors with a manifest (1, unversioned: pickles)."""
LEGACY_FILES = ("pipeline.pkl", "actor/actor_state.pt", "critic/critic.pt")
_STEP_DIR = re.compile(r"global_step_(\d+)")


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under `root` (a `checkpoints/` directory), oldest first."""
    found = [(int(m.group(1)), p) for p in root.glob("global_step_*")
             if (m := _STEP_DIR.fullmatch(p.name)) and (p / COMPLETE).exists()]
    return [p for _, p in sorted(found)]


def write_manifest(ckpt: Path) -> None:
    """`ckpt/manifest.json`: the size and sha256 of every file under `ckpt` (hashed in threads:
    hashlib lets go of the GIL)."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name not in (MANIFEST, COMPLETE))
    with ThreadPoolExecutor(max_workers=min(4, len(files) or 1)) as pool:
        digests = list(pool.map(_sha256, files))
    listed = {p.relative_to(ckpt).as_posix(): {"size": p.stat().st_size, "sha256": d} for p, d in zip(files, digests)}
    atomic_write_text(ckpt / MANIFEST, json.dumps({"format": FORMAT, "files": listed}, indent=1) + "\n")


def damage(ckpt: Path) -> str | None:
    """What is wrong with `ckpt` against its manifest, in a few words; None if nothing is."""
    if not (ckpt / MANIFEST).exists():
        return f"{MANIFEST} is missing"
    try:
        manifest = json.loads((ckpt / MANIFEST).read_bytes())
    except (ValueError, RecursionError):
        return f"{MANIFEST} is not valid JSON"
    try:
        files = _listed(manifest)
    except TypeError as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    for rel, want in files.items():
        path = ckpt / rel
        if not path.is_file():
            return f"{rel} is missing"
        if (size := path.stat().st_size) != want["size"]:
            return f"{rel} has {size} bytes, its manifest says {want['size']}"
        if _sha256(path) != want["sha256"]:
            return f"{rel} differs from its manifest (sha256)"
    return None


def refuse_legacy(ckpt: Path) -> None:
    """A checkpoint of the old format (pickles, no manifest) is refused: reading it could run code."""
    old = [f for f in LEGACY_FILES if (ckpt / f).exists()]
    if old and not (ckpt / MANIFEST).exists():
        raise CheckpointError(
            f"checkpoint {ckpt} is in the old format ({', '.join(old)}: pickles, which run code when "
            f"loaded); if you trust whoever could write it, convert it once with `asyncrl convert-checkpoint "
            f"{ckpt}`, else start over with trainer.resume_mode=disable")


def resume_point(root: Path, log: Callable[[str], None]) -> Path | None:
    """The newest complete checkpoint under `root` that is not damaged; damaged ones newer than
    it are reported and set aside. None if there is no complete checkpoint at all."""
    damaged: list[str] = []
    for ckpt in reversed(complete_checkpoints(root)):
        refuse_legacy(ckpt)
        problem = damage(ckpt)
        if problem is None:
            return ckpt
        aside = set_aside(ckpt)
        damaged.append(f"{ckpt.name} ({problem})")
        log(f"warning: checkpoint {ckpt} is damaged ({problem}); set aside as {aside.name}, "
            "resuming from the previous complete checkpoint")
    if damaged:
        raise CheckpointError(f"no undamaged checkpoint to resume from in {root}: {'; '.join(damaged)} "
                              "(set aside as global_step_K.damaged); start over with trainer.resume_mode=disable")
    return None


def verified(ckpt: Path) -> Path:
    """`ckpt` itself (named by trainer.resume_mode), checked; damaged is refused, naming the previous one."""
    refuse_legacy(ckpt)
    problem = damage(ckpt)
    if problem is None:
        return ckpt
    older = [p for p in complete_checkpoints(ckpt.parent) if _step(p) < _step(ckpt)]
    instead = f"trainer.resume_mode={older[-1]}" if older else "trainer.resume_mode=disable (no earlier checkpoint)"
    raise CheckpointError(f"checkpoint {ckpt} is damaged ({problem}); resume from {instead}")


def set_aside(ckpt: Path) -> Path:
    aside = ckpt.with_name(f"{ckpt.name}.damaged")
    n = 1
    while aside.exists():
        n += 1
        aside = ckpt.with_name(f"{ckpt.name}.damaged{n}")
    os.replace(ckpt, aside)
    return aside


def _listed(manifest: Any) -> dict[str, dict[str, Any]]:
    """The manifest's files, each checked to be a relative path inside the checkpoint."""
    files = manifest["files"] if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None
    if files is None or manifest.get("format") != FORMAT:
        raise TypeError(f"not a format-{FORMAT} manifest")
    for rel, want in files.items():
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts or not isinstance(want, dict) \
                or not isinstance(want.get("size"), int) or not isinstance(want.get("sha256"), str):
            raise TypeError(f"bad entry {rel!r}")
    return files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _step(ckpt: Path) -> int:
    m = _STEP_DIR.fullmatch(ckpt.name)
    return int(m.group(1)) if m else -1
