"""Read a run directory (written by `hrl train`, either loop; layout in `hrl.runners.rundir`) and summarize it per
iteration.

Read-only and tolerant of a run in progress: an iteration with traces but no metrics line yet is shown from
its traces alone. Per iteration, the metrics are `step_metrics` of its traces, overlaid by what the trainer
logged for that step in metrics.jsonl (the logged values win: they were computed with the real trainer version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrl.runners.metrics import FAILURES_PREFIX, step_metrics
from hrl.runners.rundir import LEGACY_TRACES, RunDir

__all__ = ["Iteration", "Run", "iteration_summaries", "load_run", "trainer_version"]

Trace = dict[str, Any]


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


def load_run(path: str | Path) -> Run:
    """Everything `hrl report` / `hrl inspect RUN_DIR` show: config, state, traces and metrics per iteration.
    Raises FileNotFoundError for a missing path, NotARunDirError for a directory that is no run."""
    run = RunDir.existing(path)
    files, traces, rows = run.trace_files(), run.traces_by_iteration(), run.metric_rows()
    legacy = run.traces / LEGACY_TRACES
    iterations = [
        Iteration(i, files.get(i) or (legacy if i in traces else None), traces.get(i, []), rows.get(i, {}))
        for i in sorted(traces.keys() | rows.keys())
    ]
    return Run(run.path, run.config(), run.state() if run.exists() else {}, iterations)


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
