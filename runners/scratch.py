"""Scratch directories in TMPDIR that name the process owning them (`hrl-<kind>-<pid>-<random>`), so that what a
killed process left behind (kill -9, out of memory) can be told apart from live runs and removed by the next one."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hrl.sandboxes.local import pid_alive

__all__ = ["scratch", "scratch_dir", "sweep_scratch"]

KINDS = ("proxy", "snapshot", "vllm", "image", "synth-tree", "synth", "px", "doctor", "node")
_NAME = re.compile(rf"^hrl-({'|'.join(KINDS)})-(\d+)-[a-z0-9_]+$")  # never a sandbox root (hrl-sbx-…)


def scratch_dir(kind: str) -> Path:
    """A new private directory; the caller removes it (what it misses, `sweep_scratch` does once it has exited)."""
    assert kind in KINDS, kind
    return Path(tempfile.mkdtemp(prefix=f"hrl-{kind}-{os.getpid()}-"))


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[Path]:
    path = scratch_dir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_scratch(parent: str | None = None) -> int:
    """Remove scratch directories whose owning process is gone; returns how many."""
    removed = 0
    for path in Path(parent or tempfile.gettempdir()).glob("hrl-*"):
        m = _NAME.match(path.name)
        if m and path.is_dir() and not pid_alive(int(m.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed
