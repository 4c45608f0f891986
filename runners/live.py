"""The live status of a running `hrl train` or `hrl eval`: `<run>/live.json`, and of `hrl rollout --out FILE`:
`FILE.live.json` beside its traces; rewritten about once a second (to a temp file, then renamed) with the episodes in
flight and the live policy version, so `hrl top` can show a run from its directory or trace file alone, over a
shared filesystem too.

    with live_status(run.path, version=lambda: engine.version):   # the training process, around its loop
        ...                                                          # `guarded_episode` registers each episode
    phase("grading")                                                 # inside an episode: what it is doing now

Outside a `live_status` block (tests, library use) the hooks do nothing. A run that ends marks the
file `finished` (or `failed`, `interrupted`); one that dies leaves it `running` with an `updated_at` that stops
moving and a pid that is gone, which `read_live` reports as `stale`, never as live.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

__all__ = [
    "LIVE_FILE",
    "SCHEMA",
    "STALE_AFTER_S",
    "LiveStatus",
    "live_episode",
    "live_file",
    "live_status",
    "phase",
    "read_live",
    "traces_live_file",
]

LIVE_FILE = "live.json"
SCHEMA = "hrl.live/1"
STALE_AFTER_S = 10.0  # ten missed heartbeats (one a second) and no writer is keeping the file
PHASES = ("starting", "sandbox", "agent", "grading")  # what an episode in flight is doing, in order


def traces_live_file(traces: str | Path) -> Path:
    """Where `hrl rollout --out FILE` keeps its live status: `FILE.live.json`, beside the traces."""
    path = Path(traces)
    return path.with_name(path.name + "." + LIVE_FILE)


def live_file(where: str | Path) -> Path:
    """The live-status file of `where`: a run directory's `live.json`, or `where` itself when it names one
    (`*.live.json`, from `traces_live_file`)."""
    path = Path(where)
    return path if path.name.endswith("." + LIVE_FILE) else path / LIVE_FILE


_STATUS: ContextVar[LiveStatus | None] = ContextVar("hrl_live_status", default=None)
_EPISODE: ContextVar[str | None] = ContextVar("hrl_live_episode", default=None)


class LiveStatus:
    """The episodes in flight of one run, written to `<run>/live.json` by a heartbeat thread every `interval_s`
    (a thread, so a trainer step that holds the event loop does not make a live run look dead)."""

    def __init__(self, run_dir: str | Path, version: Callable[[], int | None], interval_s: float = 1.0) -> None:
        self.path = live_file(run_dir)
        self.version, self.interval_s = version, interval_s
        self.episodes: dict[str, dict[str, Any]] = {}
        self.end_as: str | None = None  # how a block that returns normally ended, when not `finished` (a caught cancel)
        self.started_at = time.time()
        self._lock, self._writing = threading.Lock(), threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hrl-live-status", daemon=True)

    def open(self) -> None:
        self.write("running")
        self._thread.start()

    def close(self, state: str) -> None:
        """Stop the heartbeat and leave the file saying how the run ended, with no episode in flight."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            self.episodes.clear()
        with contextlib.suppress(OSError):  # never hides why the run ended; `hrl top` reads it as stale
            self.write(state)

    def start(self, key: str, task: str, pinned: int | None) -> None:
        """An episode starts on the live version (or the one it is pinned to: a held-out evaluation)."""
        now = time.time()
        entry = {"episode": key, "task": task, "state": "starting", "version": self._version() if pinned is None
                 else pinned, "pinned": pinned is not None, "started_at": now, "state_since": now}  # fmt: skip
        with self._lock:
            self.episodes[key] = entry

    def set_phase(self, key: str, state: str) -> None:
        with self._lock:
            if key in self.episodes:
                self.episodes[key] |= {"state": state, "state_since": time.time()}

    def end(self, key: str) -> None:
        with self._lock:
            self.episodes.pop(key, None)

    def snapshot(self, state: str) -> dict[str, Any]:
        with self._lock:
            episodes = [dict(e) for e in self.episodes.values()]
        return {"schema": SCHEMA, "state": state, "pid": os.getpid(), "host": socket.gethostname(),
                "started_at": self.started_at, "updated_at": time.time(), "interval_s": self.interval_s,
                "version": self._version(), "episodes": episodes}  # fmt: skip

    def write(self, state: str) -> None:
        """Replace the file whole (temp file + rename: a reader never sees half of it). No fsync: a status that a
        crash loses is rewritten by the next heartbeat, or reported stale."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with self._writing:  # the heartbeat and a last write share the temp file
            tmp.write_text(json.dumps(self.snapshot(state), default=str))
            tmp.replace(self.path)

    def _version(self) -> int | None:
        try:
            return self.version()
        except Exception:  # an engine between states: the status must never fail the run
            return None

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):  # a full or vanished disk: the run goes on without its status
                self.write("running")


@contextlib.contextmanager
def live_status(
    run_dir: str | Path, version: Callable[[], int | None], interval_s: float = 1.0
) -> Iterator[LiveStatus]:
    """Keep `<run>/live.json` while the block runs; episodes started inside it (in tasks created inside it) show up.
    Ends `finished`, `interrupted` (Ctrl-C, a cancel) or `failed` (an exception)."""
    status = LiveStatus(run_dir, version, interval_s)
    status.open()
    token = _STATUS.set(status)
    end = "failed"  # an exception
    try:
        yield status
        end = status.end_as or "finished"
    except (KeyboardInterrupt, asyncio.CancelledError):
        end = "interrupted"
        raise
    finally:
        _STATUS.reset(token)
        status.close(end)


@contextlib.contextmanager
def live_episode(key: str, task: str, pinned: int | None = None) -> Iterator[None]:
    """One episode in flight, from its start to its trace (a no-op outside `live_status`)."""
    status = _STATUS.get()
    if status is None:
        yield
        return
    status.start(key, task, pinned)
    token = _EPISODE.set(key)
    try:
        yield
    finally:
        _EPISODE.reset(token)
        status.end(key)


def phase(state: str) -> None:
    """What the current episode is doing now (one of `PHASES`); a no-op outside a live episode."""
    status, key = _STATUS.get(), _EPISODE.get()
    if status is not None and key is not None:
        status.set_phase(key, state)


def read_live(run_dir: str | Path, now: float | None = None) -> dict[str, Any] | None:
    """`<run>/live.json` (or a `*.live.json` file named whole) with `age_s` and `live`: whether a writer still keeps it (state `running`, updated within
    `STALE_AFTER_S`, and, on the writer's host, its pid alive); a `running` file that no writer keeps says
    `state: stale`. None when the run has no such file (not started, or from before live status)."""
    path = live_file(run_dir)
    try:
        data = dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except ValueError:  # not ours to crash on: a file damaged by hand reads as no status
        return None
    age = max(0.0, (time.time() if now is None else now) - float(data.get("updated_at", 0)))
    stale_after = max(STALE_AFTER_S, 10 * float(data.get("interval_s", 1.0)))
    running = data.get("state") == "running"
    gone = data.get("host") == socket.gethostname() and not _alive(int(data.get("pid", 0)))
    live = running and age <= stale_after and not gone
    if running and not live:
        data["state"] = "stale"
    return data | {"age_s": round(age, 1), "live": live}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
