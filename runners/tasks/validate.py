"""`hrl tasks validate`: every task's gold patch makes all listed tests pass; without a patch, FAIL_TO_PASS fail.
(Harbor task folders: solution/solve.sh scores 1 and the untouched environment 0; `harbor_verifier.check_harbor_task`.
MiniWoB++ pages: a scripted solution scores 1 and an untouched page 0; `miniwob.check_miniwob_task`.)

Each task is graded twice through the real `TestVerifier` (binary reward): with its gold `patch` and with an
empty diff. A check also reports static problems (no FAIL_TO_PASS, no gold patch, an undecodable snapshot).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from hrl.runners.tasks.load import load_tasks
from hrl.runners.tasks.results import PASSING
from hrl.runners.tasks.task import Task, TaskFormatError, snapshot_files
from hrl.runners.tasks.taskcheck import TaskCheck
from hrl.runners.tasks.verifier import TestVerifier, TestVerifierConfig, Verdict
from hrl.sandboxes import get_backend

__all__ = ["Grade", "check_task", "graders", "validate_tasks", "validate_tasks_async"]

Events = Callable[[dict[str, Any]], None]
Grade = Callable[[Task], Awaitable[Verdict]]


def _static_problems(task: Task) -> list[str]:
    problems = []
    if not task.FAIL_TO_PASS:
        problems.append("FAIL_TO_PASS is empty")
    if not task.patch.strip():
        problems.append("no gold patch")
    if task.repo_snapshot is not None:
        try:
            snapshot_files(task.repo_snapshot)
        except TaskFormatError as exc:
            problems.append(str(exc))
    return problems


def _failing(v: Verdict, tests: Sequence[str]) -> list[str]:
    outcomes = v.reward_info.get("tests", {})
    return [f"{t} ({outcomes.get(t, '?')})" for t in tests if outcomes.get(t) not in PASSING]


async def check_task(verifier: TestVerifier, task: Task) -> TaskCheck:
    """Grade one task's gold patch and an empty diff; `ok` when gold scores 1 and every FAIL_TO_PASS test fails
    (and every PASS_TO_PASS test passes) without it."""
    started = time.monotonic()
    problems = _static_problems(task)
    gold, empty = await asyncio.gather(verifier.grade(task, task.gold_patch), verifier.grade(task, ""))
    if gold.failure_reason:
        problems.append(f"gold patch: {gold.failure_reason}: {gold.reward_info.get('error')}")
    elif gold.reward != 1.0:
        extra = gold.reward_info.get("patch_error") or gold.reward_info.get("guard") or ""
        bad = _failing(gold, task.FAIL_TO_PASS + task.PASS_TO_PASS)
        problems.append(f"gold patch: reward {gold.reward}; failing: {', '.join(bad[:5]) or extra}")
    if empty.failure_reason:
        problems.append(f"no patch: {empty.failure_reason}: {empty.reward_info.get('error')}")
    elif task.grader == "r2egym":  # its expected outcomes include tests that pass before the fix too
        if empty.reward != 0.0:
            problems.append(f"no patch: reward {empty.reward}: the expected test output holds at the base state")
    else:
        passing = [t for t in task.FAIL_TO_PASS if empty.reward_info.get("tests", {}).get(t) in PASSING]
        if passing:
            problems.append(f"no patch: FAIL_TO_PASS tests pass without the fix: {', '.join(passing[:5])}")
        if bad := _failing(empty, task.PASS_TO_PASS):
            problems.append(f"no patch: PASS_TO_PASS tests fail at the base state: {', '.join(bad[:5])}")
    return TaskCheck(task.instance_id, not problems, problems, gold, empty, time.monotonic() - started)


async def validate_tasks_async(
    tasks: Sequence[Task],
    *,
    sandbox: str = "docker",
    concurrency: int = 2,
    config: TestVerifierConfig | None = None,
    on_event: Events | None = None,
) -> list[TaskCheck]:
    """Check every task (in input order), `concurrency` tasks at a time (each grades two sandboxes at once)."""
    from hrl.runners.tasks.harbor import HarborTask

    gate = asyncio.Semaphore(max(1, concurrency))
    emit = on_event or (lambda event: None)
    if any(isinstance(t, HarborTask) for t in tasks):  # Harbor folders: solution/solve.sh is the gold
        from hrl.runners.tasks.harbor_verifier import HarborVerifier, check_harbor_task

        harbor = HarborVerifier(get_backend(sandbox), run_id="hrl-validate")
        check: Callable[[Task], Awaitable[TaskCheck]] = lambda task: check_harbor_task(harbor, task)  # noqa: E731
    elif tasks and all(t.repo == "miniwob" and hasattr(t, "miniwob") for t in tasks):  # pages: a scripted solution
        from hrl.runners.tasks.miniwob import check_miniwob_task

        check = check_miniwob_task
    else:
        verifier = TestVerifier(get_backend(sandbox), _binary(config))
        check = lambda task: check_task(verifier, task)  # noqa: E731

    async def one(task: Task) -> TaskCheck:
        async with gate:
            checked = await check(task)
        emit({"event": "task_checked", **checked.to_dict()})
        return checked

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def _binary(config: TestVerifierConfig | None, **update: Any) -> TestVerifierConfig:
    """The verifier's config with a binary reward: a check asks whether the tests pass, not how many."""
    return (config or TestVerifierConfig()).model_copy(update={"reward": "binary", **update})


def graders(
    tasks: Sequence[Task], sandbox: str, config: TestVerifierConfig | None = None, run_id: str = "hrl-validate"
) -> tuple[Grade, Grade]:
    """(gold, no change): each grades one task once, in a fresh sandbox of `sandbox`. The gold is the task's gold
    patch through `TestVerifier.grade`, or for Harbor task folders solution/solve.sh (`HarborVerifier.solve`); no
    change is an empty diff, or the untouched environment."""
    from hrl.runners.tasks.harbor import HarborTask

    if any(isinstance(t, HarborTask) for t in tasks):
        from hrl.runners.tasks.harbor_verifier import HarborVerifier

        harbor = HarborVerifier(get_backend(sandbox), run_id=run_id)
        return harbor.solve, lambda task: harbor.grade(task, "")
    verifier = TestVerifier(get_backend(sandbox), _binary(config, run_id=run_id))
    return lambda task: verifier.grade(task, task.gold_patch), lambda task: verifier.grade(task, "")


def validate_tasks(
    tasks: Sequence[Task] | str | Path,
    *,
    sandbox: str = "docker",
    concurrency: int = 2,
    config: TestVerifierConfig | None = None,
    on_event: Events | None = None,
) -> list[TaskCheck]:
    """Blocking `validate_tasks_async`; `tasks` may be a task file (loaded with `load_tasks`)."""
    loaded = load_tasks(tasks) if isinstance(tasks, str | Path) else list(tasks)
    return asyncio.run(
        validate_tasks_async(loaded, sandbox=sandbox, concurrency=concurrency, config=config, on_event=on_event)
    )
