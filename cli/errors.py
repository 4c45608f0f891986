"""Exceptions → `Error: … / Hint: …` lines and exit codes, in one table. Tracebacks only with HRL_DEBUG=1.

The policy: 0 ok; 1 a data or run failure; 2 usage (an unknown name of agent, recipe, engine, sandbox, family,
dialect; a bad path, or one this user may not write; a bad `-c` key or value; a bad flag); 3 a rollout whose
infrastructure failures passed `max_error_rate`, or a training batch whose every episode failed in the
infrastructure; 4 a missing prerequisite (docker, an agent CLI that cannot install, vLLM); 130 interrupted.
Every error gets exactly one hint: the exception's own, else its row's, else the fallback. A hint that names an
`hrl` command or option names one that exists (tests/cli/test_error_policy.py runs each with --help).
"""

from __future__ import annotations

import functools
import os
import traceback
from typing import Any

from rich.text import Text

from hrl.cli.output import err
from hrl.errors import HrlError

__all__ = ["EXIT_INFRA", "EXIT_INTERRUPTED", "EXIT_USAGE", "hint_for", "infra_exit", "report", "say_error"]

EXIT_FAILURE, EXIT_USAGE, EXIT_INFRA, EXIT_PREREQ, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

DEBUG_HINT = "re-run with HRL_DEBUG=1 for the traceback"
BUG_HINT = "this is a bug in hrl; re-run with HRL_DEBUG=1 and report the traceback"


@functools.cache
def _table() -> list[tuple[type[BaseException], int, str]]:
    """The table, built on first use: its exception types live in modules `hrl --help` need not import."""
    from hrl.recipes.loader import RecipeError
    from hrl.runners.errors import (
        BatchFailedError,
        EngineError,
        EngineStartError,
        HrlError,
        ModelNotFoundError,
        PortInUseError,
        PrerequisiteError,
        UnknownNameError,
        UsageError,
    )
    from hrl.runners.rundir import RunDirBusyError
    from hrl.runners.tasks.task import Task, TaskFormatError
    from hrl.runners.trace import TraceFormatError
    from hrl.sandboxes import SandboxError, SandboxUnavailableError

    # (exception type, exit code, default hint) — first match wins, so specific types come first.
    return [
        (UnknownNameError, EXIT_USAGE, "use one of the valid names listed"),
        (ModelNotFoundError, EXIT_USAGE, "pass an HF model id or a local model dir; `hrl models tiny DIR` builds one"),
        (UsageError, EXIT_USAGE, "check the argument against the command's --help"),
        (BatchFailedError, EXIT_INFRA, "`hrl inspect RUN_DIR --json` shows each episode's metadata"),
        (PortInUseError, EXIT_FAILURE, "choose another --port, or stop the process holding it"),
        (PrerequisiteError, EXIT_PREREQ, "run `hrl doctor` to see what is missing"),
        (EngineStartError, EXIT_FAILURE, "re-run with HRL_DEBUG=1 to see the engine's log"),
        (EngineError, EXIT_FAILURE, DEBUG_HINT),
        (SandboxUnavailableError, EXIT_PREREQ, "run `hrl doctor` to see what is missing, or use `--sandbox local`"),
        (SandboxError, EXIT_FAILURE, "re-run with HRL_DEBUG=1 for the traceback; `hrl sandbox prune --all` cleans up"),
        (RunDirBusyError, EXIT_FAILURE, "let the other process finish, or stop it first"),
        (
            TaskFormatError,
            EXIT_FAILURE,
            f"each line is one JSON object (SWE-bench format) with at least {', '.join(_required(Task))}; "
            "`hrl tasks ls FILE` checks a file",
        ),
        (
            TraceFormatError,
            EXIT_FAILURE,
            "give hrl.trace/1 JSONL (what `hrl rollout --out` and `hrl serve --traces` write) or a run directory",
        ),
        (RecipeError, EXIT_FAILURE, "`hrl recipes show demo` prints a valid recipe"),
        (HrlError, EXIT_FAILURE, DEBUG_HINT),
        (FileNotFoundError, EXIT_USAGE, "check the path"),
        (IsADirectoryError, EXIT_USAGE, "give a file, not a directory"),
        (NotADirectoryError, EXIT_USAGE, "a folder on that path is a file: give another path"),
        (PermissionError, EXIT_USAGE, "give a path this user can write to (and read), or change its permissions"),
        (
            TimeoutError,
            EXIT_FAILURE,
            "it took longer than its limit (a loaded machine?): re-run it; HRL_DEBUG=1 shows what waited",
        ),
        (ValueError, EXIT_FAILURE, DEBUG_HINT),
    ]


def _required(model: Any) -> list[str]:
    return [name for name, field in model.model_fields.items() if field.is_required()]


def hint_for(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one hint for `exc`: its own hint, else its row's, else the bug hint (exit 1)."""
    code, hint = EXIT_FAILURE, BUG_HINT
    for typ, typ_code, typ_hint in _table():
        if isinstance(exc, typ):
            code, hint = typ_code, typ_hint
            break
    return code, (exc.hint if isinstance(exc, HrlError) else None) or hint


def say_error(message: str, hint: str) -> None:
    """The two lines every error prints on stderr."""
    err.print(Text.assemble(("Error: ", "bold red"), message))
    err.print(Text.assemble(("Hint: ", "yellow"), hint))


def report(exc: BaseException) -> int:
    """Print one error line and one hint to stderr and return the exit code for it."""
    if os.environ.get("HRL_DEBUG"):
        err.print(traceback.format_exc(), markup=False)
    code, hint = hint_for(exc)
    say_error(str(exc) or type(exc).__name__, hint)
    return code


def infra_exit(traces: list[dict[str, Any]], max_error_rate: float, where: str) -> int:
    """The exit code of a finished run of episodes: EXIT_INFRA, with the error and its reasons, when more than
    `max_error_rate` of them failed in the infrastructure (a cancelled episode is no such failure), else 0.
    `where` is the trace source the hint names (`hrl rollout`'s --out, `hrl eval`'s run directory)."""
    from hrl.runners.summary import infra_failure

    if (failure := infra_failure(traces, max_error_rate)) is None:
        return 0
    say_error(failure, f"the traces' metadata say why: `hrl inspect {where} --json`; `hrl doctor` checks docker and "
              "the engine")  # fmt: skip
    return EXIT_INFRA
