"""Writes that survive a crash: whole lines appended with one `write` + fsync, and files replaced atomically.

A killed process leaves either the whole line or none of it, and never half a file: what the run directory's
resume and every trace file rely on.
"""

from __future__ import annotations

import os
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


def write_atomically(path: str | Path, text: str) -> None:
    """Replace the file at `path` with `text`: readers see the old content or the new one, never a mix."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    with tmp.open() as f:
        os.fsync(f.fileno())
    tmp.replace(path)
