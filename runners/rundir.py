"""The run directory: the one layout `hrl train` writes (both loops) and `hrl report`, `hrl inspect RUN_DIR` and
`hrl train --resume` read.

run/
  config.json                       the resolved configuration, written when the run starts: the directory holds a
                                    run from then on (`--resume` continues it, a new run there is refused)
  state.json                        {"iteration": next step, "version": live policy version, "checkpoint": path}
  traces/iter-0003.jsonl            one hrl.trace/1 line per finished episode, appended as episodes finish: the
                                    episodes of step 3 (sync loop), or those started while the trainer gathered
                                    the batch of step 3 (async loop)
  traces/iter-0003.cancelled.jsonl  sync: traces a stop cut short, set aside on resume (those episodes run again)
  metrics.jsonl                     one line per training step, and one per held-out evaluation (eval/… keys)
  eval/step-0000.jsonl              the traces of the held-out evaluation before step 0 (hrl.train.heldout)
  checkpoints/v0004/                peft adapter (LoRA) or full HF checkpoint + optimizer.pt
  lock                              flock'ed by the process training here (the kernel drops it when that dies)
  live.json                         the episodes in flight, rewritten every second while the run lives, for
                                    `hrl top` (`runners/live.py`; not part of the commit point)
  eval.json                         `hrl eval` runs only: which (model, harness) each trace file holds
                                    (`runners/report/evaluation.py`)

state.json is the commit point: whatever a killed process wrote past it (traces of the unfinished step, a metrics
line of an uncommitted step) is either kept because it is complete and still valid (traces) or discarded on
resume (metrics), so each step and each episode ends up in the run exactly once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hrl.runners.durable import write_atomically
from hrl.runners.errors import HrlError, UsageError
from hrl.runners.trace import read_traces

__all__ = [
    "EVAL_PREFIX",
    "NotARunDirError",
    "RunDir",
    "RunDirBusyError",
    "RunDirTakenError",
    "is_eval_row",
    "is_run_dir",
]

Trace = dict[str, Any]
_ITER = re.compile(r"iter-(\d+)\.jsonl$")
EVAL_PREFIX = "eval/"


def is_eval_row(row: dict[str, Any]) -> bool:
    """A metrics.jsonl row of a held-out evaluation (not of a training step)."""
    return any(str(k).startswith(EVAL_PREFIX) for k in row)


class RunDirBusyError(HrlError):
    """Another live process trains in this run directory."""


class NotARunDirError(UsageError):
    """The path is not a run directory (no traces/, metrics.jsonl or state.json)."""


class RunDirTakenError(UsageError):
    """A new run was asked for in a directory that holds a run already (starting would overwrite its config)."""


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / p).exists() for p in ("traces", "metrics.jsonl", "state.json"))


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.traces = self.path / "traces"
        self.checkpoints = self.path / "checkpoints"

    @classmethod
    def existing(cls, path: str | Path) -> RunDir:
        """A run directory to read: FileNotFoundError when the path is missing, NotARunDirError when it is no run."""
        if not Path(path).exists():
            raise FileNotFoundError(f"run directory not found: {path}")
        if not is_run_dir(path):
            raise NotARunDirError(
                f"{path} is not a run directory (no traces/, metrics.jsonl or state.json)",
                hint="pass the --run-dir of an `hrl train` run, or a trace file",
            )
        return cls(path)

    # ---- config and the commit point ---------------------------------------------------------------------------
    def create(self, config: dict[str, Any]) -> None:
        self.traces.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path / "config.json", json.dumps(config, indent=2, default=str))

    def save_config(self, config: dict[str, Any]) -> None:
        """Replace the resolved config (a resume that extends the run's iterations)."""
        write_atomically(self.path / "config.json", json.dumps(config, indent=2, default=str))

    def exists(self) -> bool:
        """Has the run committed a step (state.json)?"""
        return (self.path / "state.json").is_file()

    def created(self) -> bool:
        """Does the directory hold a run: its config.json, written when the run starts, so a run stopped before its
        first step (in the step-0 evaluation, the first rollout) holds one too, and `--resume` continues it."""
        return (self.path / "config.json").is_file() or self.exists()

    def check_new(self) -> None:
        """Refuse a new run here, before anything is written, when the directory holds a run already."""
        if self.created():
            recipe = self.config().get("recipe") or "unknown"
            raise RunDirTakenError(
                f"{self.path} holds a run already (recipe {recipe}): a new run there would overwrite it",
                hint=f"`hrl train --run-dir {self.path} --resume` continues it; a new run needs another --run-dir",
            )

    def check_resumable(self) -> None:
        """Refuse `--resume` of a directory that holds no training run (none started there, or an `hrl eval` run)."""
        if not self.created():
            raise UsageError(
                f"--resume needs --run-dir of an existing run: {self.path} holds none (no config.json)",
                hint=f"start one there: `hrl train --recipe demo --run-dir {self.path}`",
            )
        if (self.path / "eval.json").is_file():
            raise UsageError(
                f"{self.path} holds an `hrl eval` run, not a training run: it cannot be resumed with `hrl train`",
                hint="give --run-dir of an `hrl train` run, or train in another --run-dir",
            )

    def config(self) -> dict[str, Any]:
        return _json_file(self.path / "config.json")

    def state(self) -> dict[str, Any]:
        if not self.exists():
            return {"iteration": 0, "version": 0, "checkpoint": None}
        return _json_file(self.path / "state.json")

    def save_state(self, iteration: int, version: int, checkpoint: str | None) -> None:
        """Commit point of a step: written atomically after the new weights are saved and published."""
        state = {"iteration": iteration, "version": version, "checkpoint": checkpoint}
        write_atomically(self.path / "state.json", json.dumps(state))

    def checkpoint(self, version: int) -> Path:
        return self.checkpoints / f"v{version:04d}"

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

    # ---- traces -------------------------------------------------------------------------------------------------
    def trace_file(self, iteration: int) -> Path:
        return self.traces / f"iter-{iteration:04d}.jsonl"

    def eval_trace_file(self, step: int) -> Path:
        return self.path / "eval" / f"step-{step:04d}.jsonl"

    def trace_files(self) -> dict[int, Path]:
        """Each step's trace file, by step (set-aside `.cancelled.jsonl` files are not among them)."""
        files = sorted(self.traces.glob("iter-*.jsonl"))
        return {int(m.group(1)): f for f in files if (m := _ITER.search(f.name))}

    def iteration_traces(self, iteration: int) -> list[Trace]:
        path = self.trace_file(iteration)
        return list(read_traces(path)) if path.is_file() else []

    def traces_by_iteration(self) -> dict[int, list[Trace]]:
        """Every trace of the run, by step (its per-step files)."""
        return {i: list(read_traces(f)) for i, f in sorted(self.trace_files().items())}

    def all_traces(self) -> list[Trace]:
        return [t for traces in self.traces_by_iteration().values() for t in traces]

    def set_aside_cancelled(self, iteration: int) -> int:
        """Move the cancelled traces of an uncommitted step (episodes cut short by Ctrl-C) from its trace file to
        iter-NNNN.cancelled.jsonl, so that a resume runs those episodes again and the step still holds one trace
        per episode. Returns how many were moved."""
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
            write_atomically(path, "".join(kept))
        return len(cut)

    # ---- metrics ------------------------------------------------------------------------------------------------
    def metric_rows(self) -> dict[int, dict[str, Any]]:
        """metrics.jsonl's training steps by step (a step logged twice, e.g. around a resume, keeps its last line)."""
        return self._rows(evals=False)

    def eval_rows(self) -> dict[int, dict[str, Any]]:
        """metrics.jsonl's held-out evaluations by the step whose policy they measured."""
        return self._rows(evals=True)

    def _rows(self, evals: bool) -> dict[int, dict[str, Any]]:
        path, rows = self.path / "metrics.jsonl", {}
        if path.is_file():
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError as e:
                        raise HrlError(f"{path}:{lineno}: not a JSON object: {e}") from e
                    if is_eval_row(row) == evals:
                        rows[int(row.get("step", len(rows)))] = row
        return rows

    def discard_uncommitted_metrics(self) -> int:
        """Drop metrics.jsonl lines of steps past the commit point (a process killed after logging a step but
        before committing it; the step runs again). Returns how many lines were dropped."""
        path, committed = self.path / "metrics.jsonl", self.state()["iteration"]
        if not path.is_file():
            return 0
        lines = path.read_text().splitlines(keepends=True)
        # a step's line counts once the step is committed; an evaluation's once the policy it measured is (the
        # policy of step k exists from the commit of step k - 1 on)
        kept = [line for line in lines if line.strip() and _committed(json.loads(line), committed)]
        if len(kept) != len(lines):
            write_atomically(path, "".join(kept))
        return len(lines) - len(kept)


def _committed(row: dict[str, Any], committed: int) -> bool:
    step = int(row.get("step", 0))
    return step <= committed if is_eval_row(row) else step < committed


def _json_file(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}
