"""The run directory: resolved config, traces per iteration, metrics.jsonl, checkpoints per version, resume state.

run/
  config.json            the resolved configuration
  state.json             {"iteration": next iteration, "version": live policy version, "checkpoint": path}
  traces/iter-0003.jsonl one hrl.trace/1 line per finished episode, appended as episodes finish
  metrics.jsonl          one line per training step
  checkpoints/v0004/     peft adapter (LoRA) or full HF checkpoint + optimizer.pt
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["RunDir"]


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

    def trace_file(self, iteration: int) -> Path:
        return self.traces / f"iter-{iteration:04d}.jsonl"

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

    @staticmethod
    def _atomic_write(path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        with tmp.open() as f:
            os.fsync(f.fileno())
        tmp.replace(path)
