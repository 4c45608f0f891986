"""The run directory: resolved config, traces per iteration, metrics.jsonl, checkpoints per version, resume state.

run/
  config.json            the resolved configuration
  state.json             {"iteration": next iteration, "version": live policy version, "checkpoint": path}
  traces/iter-0003.jsonl one hrl.trace/1 line per finished episode, appended as episodes finish
  metrics.jsonl          one line per training step
  checkpoints/v0004/     peft adapter (LoRA) or full HF checkpoint + optimizer.pt
  lock                   flock'ed by the process training in this directory (the kernel drops it when that dies)

state.json is the commit point: whatever a killed process wrote past it (traces of the unfinished iteration,
a metrics line of an uncommitted step) is either kept because it is complete and still valid (traces) or
discarded on resume (metrics), so each step and each episode ends up in the run exactly once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hrl.runners.errors import HrlError

__all__ = ["RunDir", "RunDirBusyError"]


class RunDirBusyError(HrlError):
    """Another live process trains in this run directory."""


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.traces = self.path / "traces"
        self.checkpoints = self.path / "checkpoints"

    def create(self, config: dict[str, Any]) -> None:
        self.traces.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self._atomic_write(self.path / "config.json", json.dumps(config, indent=2, default=str))

    def exists(self) -> bool:
        return (self.path / "state.json").is_file()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run for this process while the block runs (the kernel drops the lock when the process dies).
        Two processes in one run would both append the same episodes, and a resume cleans up after the previous
        process, which must therefore be gone: raises RunDirBusyError while another process holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirBusyError(
                    f"{self.path} is in use by another running process",
                    hint="let it finish or stop it first; `--resume` continues a run whose process has ended",
                ) from None
            yield
        finally:
            os.close(fd)  # releases the lock

    def trace_file(self, iteration: int) -> Path:
        return self.traces / f"iter-{iteration:04d}.jsonl"

    def set_aside_cancelled(self, iteration: int) -> int:
        """Move the cancelled traces of an uncommitted iteration (episodes cut short by Ctrl-C) from its trace file to
        iter-NNNN.cancelled.jsonl, so that a resume runs those episodes again and the iteration still holds one
        trace per episode. Returns how many were moved."""
        path = self.trace_file(iteration)
        if not path.is_file():
            return 0
        kept: list[str] = []
        cut: list[str] = []
        for line in path.read_text().splitlines(keepends=True):
            if line.strip():
                (cut if json.loads(line).get("failure_reason") == "cancelled" else kept).append(line)
        if cut:
            with path.with_suffix(".cancelled.jsonl").open("a") as f:
                f.writelines(cut)
            self._atomic_write(path, "".join(kept))
        return len(cut)

    def checkpoint(self, version: int) -> Path:
        return self.checkpoints / f"v{version:04d}"

    def state(self) -> dict[str, Any]:
        if not self.exists():
            return {"iteration": 0, "version": 0, "checkpoint": None}
        return dict(json.loads((self.path / "state.json").read_text()))

    def save_state(self, iteration: int, version: int, checkpoint: str | None) -> None:
        """Commit point of an iteration: written atomically after the new weights are saved and published."""
        state = {"iteration": iteration, "version": version, "checkpoint": checkpoint}
        self._atomic_write(self.path / "state.json", json.dumps(state))

    def discard_uncommitted_metrics(self) -> int:
        """Drop metrics.jsonl lines of steps past the commit point (a process killed after logging a step but
        before committing it; the step runs again). Returns how many lines were dropped."""
        path, committed = self.path / "metrics.jsonl", self.state()["iteration"]
        if not path.is_file():
            return 0
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) < committed]
        if len(kept) != len(lines):
            self._atomic_write(path, "".join(kept))
        return len(lines) - len(kept)

    @staticmethod
    def _atomic_write(path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        with tmp.open() as f:
            os.fsync(f.fileno())
        tmp.replace(path)
