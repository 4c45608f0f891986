"""Exceptions → `Error: … / Hint: …` lines and exit codes, in one table. Tracebacks only with HRL_DEBUG=1."""

from __future__ import annotations

import os
import traceback

from rich.text import Text

from hrl.cli.output import err
from hrl.runners.errors import (
    EngineError,
    EngineStartError,
    HrlError,
    ModelNotFoundError,
    PortInUseError,
    PrerequisiteError,
    UnknownNameError,
)
from hrl.sandboxes import SandboxError, SandboxUnavailableError

__all__ = ["EXIT_INTERRUPTED", "report"]

EXIT_FAILURE, EXIT_USAGE, EXIT_PREREQ, EXIT_INTERRUPTED = 1, 2, 4, 130

# (exception type, exit code, default hint) — first match wins, so specific types come first.
_TABLE: list[tuple[type[BaseException], int, str | None]] = [
    (UnknownNameError, EXIT_USAGE, "use one of the valid names listed"),
    (ModelNotFoundError, EXIT_FAILURE, "pass an HF model id or a local model dir; `hrl models tiny DIR` builds one"),
    (PortInUseError, EXIT_FAILURE, "choose another --port, or stop the process holding it"),
    (PrerequisiteError, EXIT_PREREQ, "run `hrl doctor` to see what is missing"),
    (EngineStartError, EXIT_FAILURE, "re-run with HRL_DEBUG=1 to see the engine's log"),
    (EngineError, EXIT_FAILURE, None),
    (SandboxUnavailableError, EXIT_PREREQ, "run `hrl doctor` to see what is missing, or use `--sandbox local`"),
    (SandboxError, EXIT_FAILURE, "re-run with HRL_DEBUG=1 for the traceback; `hrl sandbox prune --all` cleans up"),
    (HrlError, EXIT_FAILURE, None),
    (FileNotFoundError, EXIT_FAILURE, "check the path"),
    (PermissionError, EXIT_FAILURE, "check the file's permissions"),
    (ValueError, EXIT_FAILURE, None),  # includes RecipeError and TraceFormatError
]


def report(exc: BaseException) -> int:
    """Print one error line (+ hint) to stderr and return the exit code for it."""
    if os.environ.get("HRL_DEBUG"):
        err.print(traceback.format_exc(), markup=False)
    code, hint = EXIT_FAILURE, None
    for typ, typ_code, typ_hint in _TABLE:
        if isinstance(exc, typ):
            code, hint = typ_code, typ_hint
            break
    else:
        hint = "this is a bug in hrl; re-run with HRL_DEBUG=1 and report the traceback"
    hint = getattr(exc, "hint", None) or hint
    err.print(Text.assemble(("Error: ", "bold red"), str(exc)))
    if hint:
        err.print(Text.assemble(("Hint: ", "yellow"), hint))
    return code
