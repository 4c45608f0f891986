"""The one output sink: results on stdout (human or JSON), logs, progress, errors and hints on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

__all__ = ["emit", "err", "say", "want_color"]


def want_color() -> bool:
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR")


err = Console(stderr=True, highlight=False, no_color=not want_color(), soft_wrap=True)


def say(line: str) -> None:
    """One line on stderr as written (no markup): the `say` callable runners are given."""
    err.print(line, markup=False)


def emit(data: Any, *, as_json: bool, human: str | None = None) -> None:
    """Print a command's result: JSON (one document) when asked, else the human line(s)."""
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
    else:
        sys.stdout.write((human if human is not None else str(data)) + "\n")
    sys.stdout.flush()
