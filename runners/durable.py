"""Writes that survive a crash: whole lines appended with one `write` + fsync, and files replaced atomically.

A killed process leaves either the whole line or none of it, and never half a file: what the run directory's
resume and every trace file rely on.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["append_durably", "write_atomically"]


def append_durably(path: str | Path, data: bytes) -> None:
    """Append `data` (whole lines) in a single write, then fsync: a crash loses nothing already written and never
    leaves half a line for the next append to corrupt."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | Path, text: str | bytes, mode: int = 0o644) -> None:
    """Replace the file at `path` with `text` (UTF-8; bytes as they are; permissions `mode`): readers see the old
    content or the new one, never a mix. The temporary file is this writer's own, so threads or processes writing
    the same path at once each replace it whole (the last one wins) instead of renaming each other's half-written
    file."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        data = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogateescape")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(name).replace(path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
