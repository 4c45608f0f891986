"""Rich tables on stdout, as `hrl inspect` shows a trace file and a run directory: the console, the borderless
table, compact counts and seconds."""

from __future__ import annotations

import os
import sys

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["PIPE_WIDTH", "plain_table", "short_count", "short_secs", "stdout_console"]

PIPE_WIDTH = 200  # columns when piped and COLUMNS is unset: rows whole for `| less -S`, grep or a file


def stdout_console() -> Console:
    """Rich on stdout: colour only on a TTY without NO_COLOR; PIPE_WIDTH columns when piped (unless COLUMNS says),
    so that no row is cut at a terminal's width that is not there."""
    tty = sys.stdout.isatty()
    width = None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH
    no_color = not tty or bool(os.environ.get("NO_COLOR"))
    return Console(file=sys.stdout, width=width, no_color=no_color, highlight=False, emoji=False)


def plain_table(padding: int = 1) -> Table:
    """Borderless, one header rule, two spaces between columns (one with `padding=0`)."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, header_style="bold",
                 padding=(0, padding))  # fmt: skip


def short_count(n: float | None) -> str:
    """Compact count: 1234, 12.3k, 1.2M."""
    if n is None:
        return "-"
    if abs(n) >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.1f}k" if abs(n) >= 10_000 else str(n)


def short_secs(s: float | None) -> str:
    """Seconds in at most 6 characters below ~28 hours: 5.00s, 12.5s, 222s."""
    if s is None:
        return "-"
    return f"{s:.2f}s" if s < 10 else f"{s:.1f}s" if s < 100 else f"{s:.0f}s"
