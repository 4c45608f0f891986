"""`hrl report` and `hrl inspect RUN_DIR`: read a run directory, summarize it per iteration, render one HTML file."""

from hrl.runners.report.builder import build_report, render_report, write_report
from hrl.runners.report.run import Run, iteration_summaries, load_run

__all__ = ["Run", "build_report", "iteration_summaries", "load_run", "render_report", "write_report"]
