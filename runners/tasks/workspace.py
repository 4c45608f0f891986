"""A task's repository inside a sandbox: lay out its base state as a git repository, apply diffs, take a diff.

The base state is committed and pinned at `refs/hrl/base`, so the agent's diff is `git diff` against that ref
whatever the agent does with branches and commits. Commands use paths relative to the workdir (the local
backend maps only the workdir). Failures of the sandbox itself raise SandboxError; a command that fails inside
the sandbox raises WorkspaceError (a SandboxError), which verify and grade turn into episode data.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from pathlib import Path

from hrl.runners.scratch import scratch
from hrl.runners.tasks.task import Task, unpack_snapshot
from hrl.sandboxes import Sandbox, SandboxError

__all__ = ["BASE_REF", "WorkspaceError", "apply_patch", "collect_diff", "lay_out", "peek_diff"]

BASE_REF = "refs/hrl/base"
# git with a fixed identity, no hooks, no signing, no pager, paths unquoted where possible.
GIT = (
    "g() { git -c user.name=hrl -c user.email=hrl@localhost -c commit.gpgsign=false -c core.hooksPath=/dev/null "
    '-c core.quotepath=off -c core.autocrlf=false -c core.fileMode=false "$@"; }\n'
)
# Never part of a diff: bytecode and caches the agent's own test runs leave behind.
EXCLUDES = "__pycache__/\n*.py[cod]\n.pytest_cache/\n"
# A new .git holding what the old one tracks (force-added: a tracked file may match .gitignore), nothing else.
FRESH_HISTORY = """\
if [ ! -d .git ] || [ -L .git ]; then echo "hrl: .git is not a directory; cannot start a fresh history" >&2; exit 3; fi
g add -A
tracked=$(mktemp)
g ls-files -z > "$tracked"
rm -rf .git
g init -q .
g -c advice.addEmptyPathspec=false -c advice.addEmbeddedRepo=false add -f --pathspec-from-file="$tracked" --pathspec-file-nul
rm -f "$tracked"
"""


class WorkspaceError(SandboxError):
    """A git step failed inside the sandbox; `output` holds what it printed. A SandboxError, so a failing
    `prepare` counts as the sandbox's failure; `verify` and `grade` turn it into episode data instead."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message, hint="the sandbox image needs bash and git")
        self.output = output


async def _run(sandbox: Sandbox, script: str, what: str, timeout_s: float) -> str:
    result = await sandbox.exec(["bash", "-c", GIT + "set -e\n" + script], timeout_s=timeout_s)
    output = (result.stdout + result.stderr).strip()
    if result.timed_out:
        raise WorkspaceError(f"{what}: timed out after {timeout_s:g} s", output)
    if result.exit_code != 0:
        raise WorkspaceError(f"{what}: exit {result.exit_code}: {output[-1500:]}", output)
    return result.stdout


async def lay_out(
    sandbox: Sandbox, task: Task, timeout_s: float = 120, *, fresh_history: bool = False, for_agent: bool = False
) -> str:
    """Put the task's base state at the sandbox's workdir as a git repository; returns the base commit.

    With a `repo_snapshot`, its files are copied in and committed. Without one, the image must already hold a
    git repository there; it is checked out at `base_commit` (when given) and its state committed as the base.
    `fresh_history` (for the agent's sandbox): that repository's `.git` is replaced by a new one whose only commit
    is the base (same files, same tracked set), since the image's history may hold later commits — the fix, the
    hidden tests — in branches, tags, reflogs or loose objects. A `.git` that is not a directory (a worktree's
    gitfile) cannot be replaced safely: that raises WorkspaceError. A SWE-smith task's base state is the image's
    clean repository with the task's bug (`patch`) applied; `for_agent`, its FAIL_TO_PASS test files are removed
    too (SWE-smith's instance branches remove them; grading restores them from the image). An R2E-Gym task's
    test script, tests and instance files are removed `for_agent`."""
    if task.repo_snapshot is not None:
        with scratch("snapshot") as tmp:
            await asyncio.to_thread(_unpack, task.repo_snapshot, Path(tmp))
            await sandbox.copy_in(str(tmp), sandbox.workdir)
        script = f"g init -q .\nprintf '{EXCLUDES}' >> .git/info/exclude\ng add -A -f\n"
    else:
        # A SWE-bench image's HEAD is its setup commit on top of base_commit, the state its harness grades from;
        # a SWE-smith image's is the clean repository, and its base_commit names a commit of a mirror it lacks.
        own = task.base_commit and task.grader == "pytest"
        checkout = f"g checkout -q -f {task.base_commit}\n" if own else ""
        script = f"g rev-parse --git-dir >/dev/null\n{checkout}"
        if task.grader == "swesmith":
            script += await _smith_bug(sandbox, task, timeout_s, hide_tests=for_agent)
        if task.grader == "r2egym" and for_agent:  # its test script, tests and instance files, as R2E-Gym hides them
            from hrl.runners.tasks.r2egym import hidden_script

            script += hidden_script()
        script += FRESH_HISTORY if fresh_history else ""
        script += f"printf '{EXCLUDES}' >> .git/info/exclude\ng add -A\n"
    script += f"g commit -q --allow-empty --no-verify -m 'hrl base'\ng update-ref {BASE_REF} HEAD\ng rev-parse HEAD\n"
    out = await _run(sandbox, script, f"laying out {task.instance_id}", timeout_s)
    return out.strip().splitlines()[-1] if out.strip() else ""


async def _smith_bug(sandbox: Sandbox, task: Task, timeout_s: float, *, hide_tests: bool) -> str:
    """SWE-smith: the bug (`patch`) applied to the image's clean repository; for the agent's sandbox also the
    FAIL_TO_PASS test files removed, as SWE-smith's instance branches remove them. Returns script to run after."""
    from hrl.runners.tasks.swesmith import files_under_test

    await apply_patch(sandbox, task.patch, "bug", timeout_s)
    hidden = files_under_test(task, f2p_only=True) if hide_tests else []
    return "".join(f"rm -f -- {shlex.quote(f)}\n" for f in hidden)


def _unpack(snapshot: str | dict[str, str], dest: Path) -> None:
    dest.chmod(0o755)  # the directory becomes the workdir itself
    unpack_snapshot(snapshot, dest)


_DIFF = "g diff --cached --binary --no-renames --no-color --no-ext-diff --no-textconv"


async def collect_diff(sandbox: Sandbox, timeout_s: float = 120) -> str:
    """Everything changed in the workdir since the base state (tracked, new and deleted files; .gitignore'd
    files excluded), as a binary-safe git diff without rename detection."""
    out = ".git/hrl-agent.diff"
    script = f"rm -f .git/index.lock\ng add -A\n{_DIFF} {BASE_REF} --output={out}\n"
    await _run(sandbox, script, "taking the agent's diff", timeout_s)
    data = await sandbox.read_file(out)
    with contextlib.suppress(Exception):
        await sandbox.exec(["rm", "-f", out], timeout_s=30)
    return data.decode("utf-8", "surrogateescape")


async def peek_diff(sandbox: Sandbox, timeout_s: float = 120) -> str:
    """The diff `collect_diff` would take, taken mid-episode without changing what the agent sees: staged into a
    copy of the index, new objects written to a scratch object directory (the repository's own read as alternates),
    both under `.git/hrl-peek/` and removed after; the agent's index, objects and files stay as they were."""
    tmp = ".git/hrl-peek"
    script = (
        f"rm -rf {tmp}\nmkdir -p {tmp}/objects\nif [ -f .git/index ]; then cp .git/index {tmp}/index; fi\n"
        f'export GIT_INDEX_FILE="$PWD/{tmp}/index" GIT_OBJECT_DIRECTORY="$PWD/{tmp}/objects" '
        'GIT_ALTERNATE_OBJECT_DIRECTORIES="$PWD/.git/objects"\n'
        f"g add -A\n{_DIFF} {BASE_REF} --output={tmp}/diff\n"
    )
    try:
        await _run(sandbox, script, "peeking at the agent's diff", timeout_s)
        data = await sandbox.read_file(f"{tmp}/diff")
    finally:
        with contextlib.suppress(Exception):
            await sandbox.exec(["rm", "-rf", tmp], timeout_s=30)
    return data.decode("utf-8", "surrogateescape")


async def apply_patch(sandbox: Sandbox, patch: str, name: str, timeout_s: float = 120) -> None:
    """`git apply` a diff at the workdir (raises WorkspaceError with git's message when it does not apply)."""
    if not patch.strip():
        return
    path = f".git/hrl-{name}.diff"
    await sandbox.write_file(path, patch.encode("utf-8", "surrogateescape"))
    await _run(
        sandbox, f"g apply --binary --whitespace=nowarn {path}\nrm -f {path}\n", f"applying the {name}", timeout_s
    )
