"""Read a run directory (written by `hrl train`, either loop; layout in `hrl.runners.rundir`) and summarize it per
iteration.

Read-only and tolerant of a run in progress: an iteration with traces but no metrics line yet is shown from
its traces alone. Per iteration, the metrics are `step_metrics` of its traces, overlaid by what the trainer
logged for that step in metrics.jsonl (the logged values win: they were computed with the real trainer version).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrl.runners.errors import UsageError
from hrl.runners.metrics import FAILURES_PREFIX, step_metrics
from hrl.runners.rundir import NotARunDirError, RunDir, is_run_dir
from hrl.runners.trace import TraceFile, read_trace_file

__all__ = [
    "TRENDS",
    "Iteration",
    "Run",
    "iteration_summaries",
    "load_run",
    "load_source",
    "row_metric",
    "sparkline",
    "trainer_version",
    "trends",
]

Trace = dict[str, Any]


@dataclass
class Iteration:
    index: int
    trace_file: Path | None
    traces: list[Trace] = field(default_factory=list)
    logged: dict[str, Any] = field(default_factory=dict)  # this step's metrics.jsonl line, if any
    cut_line: int | None = None  # its trace file's last line, cut short by a crash and left out (None: whole)


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    state: dict[str, Any]
    iterations: list[Iteration]
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)  # held-out evaluations by step (eval/… rows)

    @property
    def traces(self) -> list[tuple[int, Trace]]:
        return [(it.index, t) for it in self.iterations for t in it.traces]

    @property
    def cut_lines(self) -> list[dict[str, Any]]:
        """`{file, line}` of each trace file whose last line was cut short (a crash mid-write) and left out."""
        return [{"file": str(it.trace_file), "line": it.cut_line} for it in self.iterations if it.cut_line]


def load_run(path: str | Path) -> Run:
    """Everything `hrl report` / `hrl inspect RUN_DIR` show: config, state, traces and metrics per iteration.
    Raises FileNotFoundError for a missing path, NotARunDirError for a directory that is no run."""
    run = RunDir.existing(path)
    read, rows = {i: read_trace_file(f) for i, f in run.trace_files().items()}, run.metric_rows()
    iterations = [_iteration(i, read.get(i), rows.get(i, {})) for i in sorted(read.keys() | rows.keys())]
    return Run(run.path, run.config(), run.state() if run.exists() else {}, iterations, run.eval_rows())


def _iteration(index: int, read: TraceFile | None, logged: dict[str, Any]) -> Iteration:
    """An iteration from its trace file as read (None: metrics logged, no trace file yet)."""
    if read is None:
        return Iteration(index, None, [], logged)
    return Iteration(index, read.path, read.traces, logged, read.cut_line)


def load_source(paths: Sequence[str | Path]) -> Run:
    """Any trace source as a `Run`, the one resolver of `hrl report` and `hrl inspect`: a run directory (what
    `load_run` reads), or trace files (what `hrl rollout --out` and `hrl serve --traces` write; a folder of them
    stands for its `*.jsonl`), one iteration per file in the order given. Raises UsageError for a missing path, a
    folder with no traces, or a run directory mixed with other sources; TraceFormatError for a file of no traces.
    A trace file whose last line a crash cut short is read up to it (`Run.cut_lines` names it)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise UsageError("no trace source given", hint="give a trace file, several, or a run directory")
    for p in paths:
        if not p.exists():
            raise UsageError(f"no such file or directory: {p}", hint="give a trace file, several, or a run directory")
    runs = [p for p in paths if is_run_dir(p)]
    if runs:
        if len(paths) > 1:
            raise UsageError(
                f"{runs[0]} is a run directory: it cannot be combined with other sources",
                hint="give one run directory, or trace files",
            )
        return load_run(runs[0])
    files: list[Path] = []
    for p in paths:
        found = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
        if not found:
            raise NotARunDirError(
                f"{p} is neither a run directory nor a folder of trace files (*.jsonl)",
                hint="give a trace file (e.g. the --out of `hrl rollout`), several, or the --run-dir of `hrl train`",
            )
        files += found
    iterations = [_iteration(i, read_trace_file(f), {}) for i, f in enumerate(files)]
    return Run(files[0].parent if len(files) > 1 else files[0], {}, {}, iterations)


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
                **({"cut_line": it.cut_line} if it.cut_line else {}),
                "failures": failures,
                "metrics": metrics,
            }
        )
    return out


TRENDS = (  # (label, metric; None: the failures' count) of the trends `hrl inspect RUN_DIR` shows
    ("reward", "trace/reward"),
    ("success", "trace/success"),
    ("failed", None),
    ("time p50", "trace/latency_s/p50"),
    ("llm p50", "trace/llm_latency_s/p50"),
    ("tool p50", "trace/tool_latency_s/p50"),
    ("prompt tok", "trace/prompt_tokens"),
    ("resp tok", "trace/response_tokens"),
    ("staleness", "trace/staleness"),
    ("loss", "train/loss"),
    ("mismatch kl", "train/mismatch_kl"),
)


def row_metric(row: dict[str, Any], key: str) -> float | None:
    """A metric of an `iteration_summaries` row as a number (None: absent, or not a number)."""
    v = row["metrics"].get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def trends(rows: list[dict[str, Any]]) -> list[tuple[str, list[float | None]]]:
    """Each of `TRENDS` over the iterations (`iteration_summaries` rows) that has data: its label and its value per
    iteration (None where it has none)."""
    out = []
    for label, key in TRENDS:
        values = [float(sum(r["failures"].values())) if key is None else row_metric(r, key) for r in rows]
        if any(v is not None for v in values):
            out.append((label, values))
    return out


_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 60) -> str:
    """One character per value (a blank for None), scaled min→max; more than `width` values are averaged into
    `width` buckets."""
    if len(values) > width:
        size = len(values) / width
        chunks = [values[int(i * size) : int((i + 1) * size)] for i in range(width)]
        values = [(sum(xs) / len(xs)) if (xs := [v for v in c if v is not None]) else None for c in chunks]
    known = [v for v in values if v is not None]
    if not known:
        return " " * len(values)
    lo, hi = min(known), max(known)
    top = len(_SPARK) - 1
    return "".join(" " if v is None else _SPARK[round((v - lo) / (hi - lo) * top) if hi > lo else 0] for v in values)
