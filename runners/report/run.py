"""Read a run directory (written by `hrl train`; layout in `hrl.train.rundir`) and summarize it per iteration.

Read-only and tolerant of a run in progress: an iteration with traces but no metrics line yet is shown from
its traces alone. Per iteration, the metrics are `step_metrics` of its traces, overlaid by what the trainer
logged for that step in metrics.jsonl (the logged values win: they were computed with the real trainer version).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrl.runners.errors import HrlError
from hrl.runners.metrics import FAILURES_PREFIX, step_metrics
from hrl.runners.trace import read_traces

__all__ = ["Iteration", "NotARunDirError", "Run", "is_run_dir", "iteration_summaries", "load_run", "trainer_version"]

Trace = dict[str, Any]
_ITER = re.compile(r"iter-(\d+)\.jsonl$")


class NotARunDirError(HrlError):
    """The path is not a run directory (no traces/, metrics.jsonl or state.json)."""


@dataclass
class Iteration:
    index: int
    trace_file: Path | None
    traces: list[Trace] = field(default_factory=list)
    logged: dict[str, Any] = field(default_factory=dict)  # this step's metrics.jsonl line, if any


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    state: dict[str, Any]
    iterations: list[Iteration]

    @property
    def traces(self) -> list[tuple[int, Trace]]:
        return [(it.index, t) for it in self.iterations for t in it.traces]


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / p).exists() for p in ("traces", "metrics.jsonl", "state.json"))


def _json_file(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def _metric_rows(path: Path) -> dict[int, dict[str, Any]]:
    """metrics.jsonl by step (a step logged twice, e.g. around a resume, keeps its last line)."""
    rows: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise HrlError(f"{path}:{lineno}: not a JSON object: {e}") from e
                rows[int(row.get("step", len(rows)))] = row
    return rows


def load_run(path: str | Path) -> Run:
    """Everything `hrl report` / `hrl inspect RUN_DIR` show: config, state, traces and metrics per iteration."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"run directory not found: {root}")
    if not is_run_dir(root):
        raise NotARunDirError(
            f"{root} is not a run directory (no traces/, metrics.jsonl or state.json)",
            hint="pass the --run-dir of an `hrl train` run, or a trace file",
        )
    files = {int(m.group(1)): f for f in sorted((root / "traces").glob("iter-*.jsonl")) if (m := _ITER.search(f.name))}
    rows = _metric_rows(root / "metrics.jsonl")
    iterations = [
        Iteration(i, files.get(i), list(read_traces(files[i])) if i in files else [], rows.get(i, {}))
        for i in sorted(files.keys() | rows.keys())
    ]
    return Run(root, _json_file(root / "config.json"), _json_file(root / "state.json"), iterations)


def trainer_version(logged: dict[str, Any]) -> int | None:
    """The policy version the step trained: logged as `train/version`, else the synchronous loop's
    published `version` − 1."""
    if isinstance(logged.get("train/version"), int | float):
        return int(logged["train/version"])
    return int(logged["version"]) - 1 if isinstance(logged.get("version"), int) else None


def iteration_summaries(run: Run) -> list[dict[str, Any]]:
    """Per iteration: index, trace file, trace count, failures by reason (non-zero) and the flat metrics."""
    out = []
    for it in run.iterations:
        version = trainer_version(it.logged)
        if version is None and it.index == run.state.get("iteration"):  # in progress: sampled by the live version
            version = run.state.get("version")
        metrics: dict[str, Any] = step_metrics(it.traces, version) if it.traces else {}
        metrics |= {k: v for k, v in it.logged.items() if v is not None}
        failures = {
            k.removeprefix(FAILURES_PREFIX): int(v)
            for k, v in metrics.items()
            if k.startswith(FAILURES_PREFIX) and k != FAILURES_PREFIX + "none" and isinstance(v, int | float) and v
        }
        out.append(
            {
                "iteration": it.index,
                "trace_file": str(it.trace_file) if it.trace_file else None,
                "traces": len(it.traces),
                "failures": failures,
                "metrics": metrics,
            }
        )
    return out
