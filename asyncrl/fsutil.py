"""Write a file so that readers see the old contents or the new, never a torn or empty file.

The data goes to `PATH.tmp` in the same directory (so the rename stays on one filesystem), is
fsynced, then `os.replace`d over PATH, and the directory is fsynced (best effort) so the
rename survives a power cut. If anything fails (a full disk: ENOSPC), the temp file is removed,
PATH is left as it was, and the OSError propagates. Not for files that several processes write
at once: they would share the one temp name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def _fsync_dir(directory: Path) -> None:
    # Best effort: the new contents are already in place; some filesystems refuse a directory fsync.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def nearest_unwritable(where: Path) -> tuple[Path, str | None]:
    """The nearest directory of `where` that exists (itself or a parent) and why a new file cannot
    be made there ("<dir> is a file, not a directory", "cannot write in <dir> (<reason>)"), or None
    when one can: checked by making one, so a read-only directory fails before any work."""
    existing = where.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return existing, f"{existing} is a file, not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return existing, f"cannot write in {existing} ({exc.strerror or exc})"
    return existing, None
