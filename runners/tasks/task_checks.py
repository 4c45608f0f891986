"""`hrl tasks check`: is each task fit to train on? Its gold solution K times and no change K times, each in a fresh
sandbox, graded by the real verifier (`validate.graders`), and the task classed:

- `infra`: grading itself failed in some run (a `verifier_error`): nothing can be said of the task;
- `flaky`: a test's outcome differs between runs of the same patch (the tests are named), or, where a verdict names
  no tests (Harbor), its reward does;
- `gold_fails`: the gold never scores 1;
- `noop_passes`: no change scores 1;
- `weak_suite`: graded as `ok` would be, but a task `hrl tasks synth` made whose tests cannot guard its package (too
  few tests, most test files unusable, no PASS_TO_PASS, a problem statement that opens as another task's of the
  file): `suite.task_problems` names each problem. Judged again at every check, on top of the grading (cached or not);
- `ok`: none of these.

The first that applies wins. One run per patch cannot see a flaky test: K >= 2 can, the more so the larger.

Results are cached by the task's content hash (`content_hash`: what grading depends on, not its wording) under
`$HRL_CACHE/task-checks/<hash>.json`, with K, the sandbox and the hrl version. `hrl train` and `hrl eval` read that
cache through `filter_checked`: a task checked and not `ok` is left out, one never checked is kept and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hrl.runners.durable import write_atomically
from hrl.runners.tasks.suite import task_problems
from hrl.runners.tasks.task import Task, files_digest
from hrl.runners.tasks.validate import Grade, graders
from hrl.runners.tasks.verifier import TestVerifierConfig, Verdict
from hrl.sandboxes import SandboxError

__all__ = [
    "STATUSES",
    "CheckReport",
    "TaskCheckResult",
    "cache_dir",
    "check_tasks",
    "check_tasks_async",
    "checked_task_file",
    "classify",
    "content_hash",
    "filter_checked",
    "heldout_for_run",
    "judged",
    "read_check",
    "select_for_run",
    "tasks_for_run",
]

SCHEMA = "hrl.task-check/1"
STATUSES = ("ok", "gold_fails", "noop_passes", "flaky", "weak_suite", "infra")
# What a person reads, not what grading runs: a task reworded (or renamed) keeps its check.
_WORDING = ("instance_id", "problem_statement", "hints_text", "created_at", "task_dir")
Events = Callable[[dict[str, Any]], None]
Say = Callable[[str], object]
Changed = dict[str, dict[str, list[str]]]  # {"gold" | "noop": {test: its outcome in each run}}


def cache_dir() -> Path:
    """Where checks are kept, across runs and checkouts: `$HRL_CACHE/task-checks` (default ~/.cache/hrl)."""
    return Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser() / "task-checks"


def content_hash(task: Task) -> str:
    """`sha256:…` of what grading a task depends on: its record (canonical JSON, set fields only, its wording left
    out) and, for a Harbor task, every file of its folder (solution/ and tests/ included)."""
    record = task.model_dump(mode="json", exclude_defaults=True)
    for key in _WORDING:
        record.pop(key, None)
    files = [("task.json", json.dumps(record, sort_keys=True, separators=(",", ":")).encode())]
    folder = dict(task).get("task_dir")  # a Harbor task's, declared or carried as an extra field
    if folder:
        root = Path(folder)
        files += [(f"folder/{p.relative_to(root)}", p.read_bytes()) for p in root.rglob("*") if p.is_file()]
    return files_digest(files)


@dataclass
class TaskCheckResult:
    instance_id: str
    content_hash: str
    status: str  # one of STATUSES
    runs: int  # K: runs of each patch
    sandbox: str
    gold_rewards: list[float | None] = field(default_factory=list)
    noop_rewards: list[float | None] = field(default_factory=list)
    changed: Changed = field(default_factory=dict)  # the tests whose outcome changed, per side
    problems: list[str] = field(default_factory=list)
    hrl_version: str = ""
    checked_at: float = 0.0  # unix time
    seconds: float = 0.0
    cached: bool = False  # read from the cache by this check, not graded now

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskCheckResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def reusable(self, runs: int, sandbox: str) -> bool:
        """Whether `hrl tasks check --runs runs --sandbox sandbox` may take this result instead of grading again:
        as many runs or more, the same sandbox kind and hrl version, and grading did not fail (infra is retried)."""
        return (
            self.status != "infra" and self.runs >= runs and self.sandbox == sandbox and self.hrl_version == _version()
        )


# ---- classing ------------------------------------------------------------------------------------------------


def classify(gold: Sequence[Verdict], noop: Sequence[Verdict]) -> tuple[str, Changed, list[str]]:
    """(status, changed tests per side, problems) of a task from its gold runs and its no-change runs."""
    sides = {"gold": gold, "noop": noop}
    errors = [
        f"{side} run {i}: {v.reward_info.get('error')}"
        for side, runs in sides.items()
        for i, v in enumerate(runs, 1)
        if v.failure_reason
    ]
    if errors:
        return "infra", {}, errors
    changed = {side: tests for side, runs in sides.items() if (tests := changed_tests(runs))}
    if changed:
        said = [f"{side}: {t} was {', '.join(outs)}" for side, tests in changed.items() for t, outs in tests.items()]
        return "flaky", changed, said
    if not any(v.reward == 1.0 for v in gold):
        return "gold_fails", {}, [f"gold: reward {gold[0].reward:g}{_why(gold[0])}"] if gold else ["no gold run"]
    if any(v.reward == 1.0 for v in noop):
        return "noop_passes", {}, ["no change: reward 1"]
    return "ok", {}, []


def judged(result: TaskCheckResult, weak: list[str]) -> TaskCheckResult:
    """`result` with its task's suite judged on top of its grading: graded ok (or weak_suite, by an earlier check)
    becomes weak_suite naming `weak`, the problems of `suite.task_problems`, or ok when there are none; any other
    status stays."""
    if result.status not in ("ok", "weak_suite"):
        return result
    return replace(result, status="weak_suite" if weak else "ok", problems=list(weak))


def changed_tests(runs: Sequence[Verdict]) -> dict[str, list[str]]:
    """{test: its outcome in each run} for the tests whose outcome is not the same in every run; a test a run did
    not report (its tests timed out, say) is NOT_RUN there. Verdicts that name no tests: the reward, if it changed."""
    per_run = [dict(v.reward_info.get("tests") or {}) for v in runs]
    names = sorted({t for tests in per_run for t in tests})
    outcomes = {t: [tests.get(t, "NOT_RUN") for tests in per_run] for t in names}
    changed = {t: outs for t, outs in outcomes.items() if len(set(outs)) > 1}
    if not names and len({v.reward for v in runs}) > 1:
        changed["(reward)"] = [f"{v.reward:g}" for v in runs if v.reward is not None]
    return changed


def _why(v: Verdict) -> str:
    info = v.reward_info
    failing = [f"{t} {o}" for t, o in (info.get("tests") or {}).items() if o not in ("PASSED", "XFAIL")]
    why = info.get("patch_error") or info.get("guard") or info.get("timeout") or ", ".join(failing[:5])
    return f" ({why})" if why else ""


# ---- running -------------------------------------------------------------------------------------------------


async def check_tasks_async(
    tasks: Sequence[Task],
    *,
    runs: int = 3,
    sandbox: str = "docker",
    concurrency: int = 2,
    config: TestVerifierConfig | None = None,
    recheck: bool = False,
    cache: Path | None = None,
    on_event: Events | None = None,
) -> list[TaskCheckResult]:
    """Check every task (results in input order), `concurrency` gradings (sandboxes) at a time; a cached result
    that is `reusable` is taken as it is unless `recheck`. Each result is written to the cache as it is known."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    folder = cache or cache_dir()
    gold, noop = graders(tasks, sandbox, config, run_id="hrl-check")
    gate = asyncio.Semaphore(max(1, concurrency))
    emit = on_event or (lambda event: None)
    weak = task_problems(tasks)  # across the tasks: a problem statement that opens as another's

    async def graded(grade: Grade, task: Task) -> Verdict:
        async with gate:
            try:
                return await grade(task)
            except (SandboxError, OSError) as exc:  # a Harbor image that cannot be built, say
                return Verdict.error(f"grading sandbox failed: {exc}")

    async def one(task: Task) -> TaskCheckResult:
        digest = content_hash(task)
        known = read_check(digest, folder)
        if known is not None and not recheck and known.reusable(runs, sandbox):
            known.instance_id, known.cached = task.instance_id, True
            now = judged(known, weak.get(task.instance_id, []))
            if (now.status, now.problems) != (known.status, known.problems):
                _write(folder, now)  # what train and eval read: the judgement of this check
            emit({"event": "task_checked", **now.to_dict()})
            return now
        started = time.monotonic()
        verdicts = await asyncio.gather(*(graded(g, task) for g in [gold] * runs + [noop] * runs))
        status, changed, problems = classify(verdicts[:runs], verdicts[runs:])
        result = TaskCheckResult(
            task.instance_id, digest, status, runs, sandbox, [v.reward for v in verdicts[:runs]],
            [v.reward for v in verdicts[runs:]], changed, problems, _version(), time.time(),
            round(time.monotonic() - started, 2),
        )  # fmt: skip
        result = judged(result, weak.get(task.instance_id, []))
        _write(folder, result)
        emit({"event": "task_checked", **result.to_dict()})
        return result

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def check_tasks(tasks: Sequence[Task], **options: Any) -> list[TaskCheckResult]:
    """Blocking `check_tasks_async`."""
    return asyncio.run(check_tasks_async(tasks, **options))


# ---- the cache -----------------------------------------------------------------------------------------------


def _path(folder: Path, digest: str) -> Path:
    return folder / f"{digest.removeprefix('sha256:')}.json"


def read_check(digest: str, cache: Path | None = None) -> TaskCheckResult | None:
    """The cached check of a content hash, or None (never checked, or a file that cannot be read)."""
    try:
        data = json.loads(_path(cache or cache_dir(), digest).read_text())
        return TaskCheckResult.from_dict(data) if data.get("schema") == SCHEMA else None
    except (OSError, ValueError, TypeError):
        return None


def _write(folder: Path, result: TaskCheckResult) -> None:
    """Atomically: checks of the same task running at once leave one whole file."""
    folder.mkdir(parents=True, exist_ok=True)
    target = _path(folder, result.content_hash)
    write_atomically(target, json.dumps({**result.to_dict(), "cached": False}, indent=1) + "\n")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("hrl")
    except Exception:  # a source tree that is not installed
        return "0+unknown"


# ---- what train and eval use ---------------------------------------------------------------------------------


@dataclass
class CheckReport:
    """What `filter_checked` did to a task list: the run's metadata keeps it, and `line()` says it at the start."""

    total: int
    kept: list[str]  # instance ids used
    left_out: dict[str, str]  # instance id -> status (not ok), left out
    unchecked: list[str]  # never checked (kept)
    not_ok_used: dict[str, str] = field(default_factory=dict)  # include_unchecked: not ok, used anyway
    include_unchecked: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, what: str = "tasks") -> str:
        """One line for stderr: how many are used, which are left out and why, how many were never checked."""
        if self.include_unchecked:
            head = f"{what}: all {self.total} used (--include-unchecked)"
            bad = self.not_ok_used
        else:
            head = f"{what}: {len(self.kept)} of {self.total} used"
            bad = self.left_out
        parts = [head]
        if bad:
            verb = "not ok, used anyway" if self.include_unchecked else "left out by `hrl tasks check`"
            parts.append(f"{len(bad)} {verb} ({_listed(bad)})")
        parts.append(f"{len(self.unchecked)} unchecked" + (" (`hrl tasks check` them)" if self.unchecked else ""))
        return "; ".join(parts)


def _listed(statuses: dict[str, str], most: int = 10) -> str:
    """`flaky: a, b; gold_fails: c`, at most `most` ids per status (the metadata holds them all)."""
    out = []
    for status in STATUSES:
        ids = [i for i, s in statuses.items() if s == status]
        if ids:
            more = f" and {len(ids) - most} more" if len(ids) > most else ""
            out.append(f"{status}: {', '.join(ids[:most])}{more}")
    return "; ".join(out)


def filter_checked(
    tasks: Sequence[Task], include_unchecked: bool = False, cache: Path | None = None
) -> tuple[list[Task], CheckReport]:
    """The tasks to use, in order, and the report: a task whose cached check (any K, sandbox or version) is not
    `ok` is left out; one never checked is kept; `include_unchecked` keeps every task (still counting them)."""
    folder = cache or cache_dir()
    kept: list[Task] = []
    left_out: dict[str, str] = {}
    unchecked: list[str] = []
    for task in tasks:
        known = read_check(content_hash(task), folder) if folder.is_dir() else None
        if known is None:
            unchecked.append(task.instance_id)
        elif known.status != "ok":
            left_out[task.instance_id] = known.status
            if not include_unchecked:
                continue
        kept.append(task)
    report = CheckReport(len(tasks), [t.instance_id for t in kept], {}, unchecked, {}, include_unchecked)
    if include_unchecked:
        report.not_ok_used = left_out
    else:
        report.left_out = left_out
    return kept, report


def select_for_run(
    tasks: Sequence[Task], run_path: Path, key: str, include_unchecked: bool = False
) -> tuple[list[Task], CheckReport]:
    """`filter_checked` for a run directory: the first start writes its report to `task_checks.json` under `key`
    ("tasks", "eval_tasks"); a resumed run takes the same tasks again, whatever was checked since."""
    saved_file = run_path / "task_checks.json"
    saved: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(saved_file.read_text())
    if isinstance(saved.get(key), dict):
        report = CheckReport(**saved[key])
        chosen = set(report.kept)
        return [t for t in tasks if t.instance_id in chosen], report
    kept, report = filter_checked(tasks, include_unchecked)
    saved[key] = report.to_dict()
    saved_file.write_text(json.dumps(saved, indent=1) + "\n")
    return kept, report


def checked_task_file(
    task_file: str | Path, include_unchecked: bool, limit: int, say: Say
) -> tuple[list[Task], CheckReport]:
    """The tasks of `task_file` that `hrl rollout` and `hrl eval` run: the first `limit` (0: all) of those
    `filter_checked` keeps; its report, said to `say`, too."""
    from hrl.runners.tasks.load import load_tasks

    kept, report = filter_checked(load_tasks(task_file), include_unchecked)
    say(report.line())
    return kept[: limit or None], report


def tasks_for_run(
    tasks_file: str, eval_file: str, run_path: Path, include_unchecked: bool, say: Say
) -> tuple[list[Task], list[Task] | None]:
    """A training run's tasks and held-out tasks (None: none), less those `hrl tasks check` found not ok (said to
    `say`, and kept in the run's task_checks.json, which a resumed run takes its tasks from again)."""
    from hrl.runners.errors import UsageError
    from hrl.runners.tasks.load import load_tasks

    tasks, report = select_for_run(load_tasks(tasks_file), run_path, "tasks", include_unchecked)
    say(report.line("tasks"))
    if not tasks:
        raise UsageError(
            f"every task of {tasks_file} was left out: `hrl tasks check` found none ok",
            hint="fix the tasks and `hrl tasks check --recheck` them, or train on them anyway with --include-unchecked",
        )
    return tasks, heldout_for_run(eval_file, run_path, include_unchecked, say)


def heldout_for_run(eval_file: str, run_path: Path, include_unchecked: bool, say: Say) -> list[Task] | None:
    """A run's held-out tasks (`eval_tasks`; None: none), chosen and said as `tasks_for_run` chooses its tasks."""
    if not eval_file:
        return None
    from hrl.runners.tasks.load import load_tasks

    heldout, report = select_for_run(load_tasks(eval_file), run_path, "eval_tasks", include_unchecked)
    say(report.line("held-out tasks"))
    return heldout or None
