"""Anti reward-hacking rules: which parts of an agent's diff never reach the grading sandbox.

The verifier grades the agent's diff, not its sandbox. Before the diff is applied in a fresh grading sandbox, every
file section that touches a protected path is dropped — whether it adds, edits or deletes the file — and the
hidden test patch is applied last. A path is protected when

1. the task's `test_patch` touches it, or it stands in the way of such a path (a file where the patch needs a
   directory, or the other way round): the hidden tests always win, and always apply, or
2. one of its components matches a `protected` glob (defaults in DEFAULT_PROTECTED: test files and test
   directories, pytest/tox/setuptools configuration, conftest.py, sitecustomize/usercustomize, *.pth, bytecode,
   *.dist-info/*.egg-info metadata that could register a pytest plugin), or
3. it is a new file or package at an import root (the repository root, `src/`, or a PYTHONPATH entry of the task)
   whose module name shadows the standard library or the test runner (`pytest.py`, `json/`, `_pytest/` …);
   no import roots given = no such check.

Added lines that import the test runner (`import pytest`, `from _pytest…`, `__import__("pluggy")`,
`sys.modules["pytest"]`) outside protected files are flagged by `runner_hooks`; the verifier then gives reward 0.
Code under test runs in the test process, so a determined agent can still tamper with the runner in ways no
static rule sees; these rules close the cheap, generic hacks.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import sys

from hrl.runners.tasks.patches import FilePatch, patch_paths, split_patch

__all__ = ["DEFAULT_PROTECTED", "RUNNER_MODULES", "filter_patch", "protected_reason", "runner_hooks"]

DEFAULT_PROTECTED: tuple[str, ...] = (
    "test", "tests", "test_*.py", "*_test.py", "conftest.py",
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml",
    "sitecustomize.py", "usercustomize.py", "*.pth", "__pycache__", "*.pyc", "*.pyo", "*.dist-info", "*.egg-info",
    ".gitattributes",
)  # fmt: skip
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "pygments"})
_HOOK = re.compile(
    r"^\s*(?:import\s+[\w., ]*\b(?:_?pytest|pluggy)\b|from\s+(?:_?pytest|pluggy)\b)"
    r"|(?:__import__|import_module)\(\s*['\"](?:_?pytest|pluggy)"
    r"|sys\.modules\[\s*['\"](?:_?pytest|pluggy)"
)


def protected_reason(
    fp: FilePatch, hidden: set[str], globs: tuple[str, ...] | list[str], import_roots: tuple[str, ...] = ()
) -> str | None:
    """Why this file's part of an agent diff must be dropped, or None to keep it."""
    if fp.path in hidden or any(fp.path.startswith(h + "/") or h.startswith(fp.path + "/") for h in hidden):
        return "hidden test file"  # the path itself, or a file/directory in the way of one
    parts = fp.path.split("/")
    for part in parts:
        for glob in globs:
            if fnmatch.fnmatchcase(part, glob):
                return f"protected ({glob})"
    if fp.kind == "new":
        for root in import_roots:
            rel = fp.path if root in ("", ".") else posixpath.relpath(fp.path, root)
            if rel.startswith("../"):
                continue
            top = rel.split("/", 1)[0]
            module = top[:-3] if top.endswith(".py") and "/" not in rel else top
            if module in RUNNER_MODULES or module in sys.stdlib_module_names:
                return f"shadows module {module!r}"
    return None


def filter_patch(
    diff: str,
    test_patch: str,
    globs: tuple[str, ...] | list[str] = DEFAULT_PROTECTED,
    import_roots: tuple[str, ...] = ("", "src"),
) -> tuple[str, dict[str, str]]:
    """The agent's diff without its protected parts, and {dropped path: reason}."""
    hidden = set(patch_paths(test_patch))
    kept, dropped = [], {}
    for fp in split_patch(diff):
        reason = protected_reason(fp, hidden, globs, import_roots)
        if reason:
            dropped[fp.path] = reason
        else:
            kept.append(fp.text)
    return "".join(kept), dropped


def runner_hooks(diff: str) -> list[str]:
    """Added lines of a diff that reach into the test runner (first few)."""
    hits = [
        line[1:].strip()[:200]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++ ") and _HOOK.search(line[1:])
    ]
    return hits[:5]
