"""Client keys of an online run: a key opens sessions and posts rewards for its own sessions, nothing else.

The keys file (`<run>/client_keys.json` by default, mode 0600) keeps each key's name and a digest of it, never the
key: `add_key` prints a key once. `ClientKeys` reads the file again when it changes, so a key added while the run
serves works at once, and a key removed from the file stops working."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from hrl.runners.durable import write_atomically
from hrl.runners.errors import UsageError

__all__ = ["KEYS_FILE", "KEY_PREFIX", "ClientKeys", "add_key", "keys_path"]

KEYS_FILE = "client_keys.json"
KEY_PREFIX = "hrlc-"  # tells a client key from the control token and a session's hrl-<token> at a glance
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode(errors="replace"), digest_size=32).hexdigest()


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text() or "{}")
    return list(data.get("keys") or [])


def keys_path(run_dir: Path | None, keys_file: Path | None) -> Path:
    """The keys file `hrl keys` works on: the run's (`run_dir`/client_keys.json) or `keys_file`, exactly one given."""
    if (run_dir is None) == (keys_file is None):
        raise UsageError("give --run-dir or --keys-file (one of them)", hint="e.g. hrl keys add fleet --run-dir RUN")
    return keys_file if keys_file is not None else run_dir / KEYS_FILE  # type: ignore[operator]


def add_key(path: Path, name: str) -> str:
    """Add a client key named `name` to the keys file at `path` (created 0600); the key, shown once."""
    if not _NAME.match(name):
        raise UsageError(f"client key name {name!r}: letters, digits, '.', '_' and '-', at most 64",
                         hint="e.g. hrl keys add fleet-a --run-dir RUN")  # fmt: skip
    keys = _read(path)
    if any(k["name"] == name for k in keys):
        raise UsageError(f"{path} already has a client key named {name}", hint="choose another name")
    key = KEY_PREFIX + secrets.token_urlsafe(24)
    keys.append({"name": name, "digest": _digest(key), "created_at": round(time.time(), 3)})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"keys": keys}, indent=2), mode=0o600)
    return key


class ClientKeys:
    """The keys file of a run, read again when it changes; `name_for(key)` is the key's name or None."""

    prefix = KEY_PREFIX  # what every client key starts with (the proxy tells a mistyped one from other tokens)

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._keys: list[tuple[str, str]] = []  # (name, digest)

    def _load(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._keys, self._stamp = [], None
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._keys, self._stamp = [(k["name"], k["digest"]) for k in _read(self.path)], stamp

    def names(self) -> list[str]:
        self._load()
        return [n for n, _ in self._keys]

    def name_for(self, key: str) -> str | None:
        """The name of client key `key` (compared in constant time against every key), None for no key of this run."""
        if not key.startswith(KEY_PREFIX):
            return None
        self._load()
        given, found = _digest(key), None
        for name, digest in self._keys:
            if hmac.compare_digest(given, digest):
                found = name
        return found
