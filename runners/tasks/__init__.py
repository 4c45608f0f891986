"""Tasks: the SWE-bench task format, Harbor task folders (`harbor`, `harbor_verifier`), the test-based verifier, validation, the grading image and task synthesis.

`VERIFIERS` maps a verifier name to "module:Class"; modules load only when asked for (synthesis pulls in the
AST mutator, the image builder the Docker SDK).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from hrl.registry import lookup
from hrl.runners.tasks.load import load_tasks, task_summary
from hrl.runners.tasks.task import Task, TaskFormatError, write_tasks
from hrl.runners.tasks.verifier import TestVerifier, TestVerifierConfig, Verdict, Verifier
from hrl.sandboxes import SandboxBackend

__all__ = [
    "VERIFIERS",
    "Task",
    "TaskFormatError",
    "TestVerifier",
    "TestVerifierConfig",
    "Verdict",
    "Verifier",
    "ensure_image",
    "load_tasks",
    "make_verifier",
    "synthesize",
    "task_summary",
    "validate_tasks",
    "verifier_for",
    "write_tasks",
]

VERIFIERS: dict[str, str] = {
    "tests": "hrl.runners.tasks.verifier:TestVerifier",
    "harbor": "hrl.runners.tasks.harbor_verifier:HarborVerifier",
    "miniwob": "hrl.runners.tasks.miniwob:MiniWoBVerifier",
}


def verifier_for(task_file: str | Path) -> str:
    """The verifier a task source is graded by when the recipe names none: harbor for a folder of Harbor tasks,
    miniwob for `miniwob:` pages, else tests."""
    from hrl.runners.tasks.harbor import is_harbor_source

    if str(task_file).startswith("miniwob:"):
        return "miniwob"
    return "harbor" if task_file and is_harbor_source(task_file) else "tests"


def make_verifier(name: str, backend: SandboxBackend, **options: Any) -> Verifier:
    """A verifier by registry name, grading in sandboxes of `backend`; options go to its config."""
    # `python` scores a Python agent's answer in its own process (runners/whitebox); a CLI's episode has no answer
    also = "python, with a Python agent only (white-box recipes)"
    verifier: Verifier = lookup(VERIFIERS, "verifier", name, also=also)(backend, **options)
    return verifier


def __getattr__(name: str) -> Any:  # the heavier entry points load on first use
    lazy = {
        "ensure_image": "hrl.runners.tasks.sandbox_images",
        "synthesize": "hrl.runners.tasks.synth",
        "validate_tasks": "hrl.runners.tasks.validate",
    }
    if name in lazy:
        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
