"""Does a synthesized task's test suite guard its package? The limits, what synthesis measured, the problems named.

A task graded only by the tests it lists passes `hrl tasks validate` (gold → 1, no change → 0) even when those tests
cannot tell a fix from damage: a suite of one test, a task with no PASS_TO_PASS test (a patch that breaks the rest of
the package still scores 1), ten tasks whose problem statements open alike (an agent cannot tell them apart).
`hrl tasks synth` measures its suite at baseline (`SuiteStats`, kept in each task's `synth.suite` record with the
limits it ran under) and refuses a weak one; `hrl tasks check` names the same problems per task (`task_problems`).
Tasks not made by `hrl tasks synth` carry no such record and are not judged here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.tasks.sdist import SdistError
from hrl.runners.tasks.task import Task

__all__ = ["SuiteConfig", "SuiteStats", "WeakSuiteError", "opening", "task_problems"]


class SuiteConfig(BaseModel):
    """Below these a suite (or a task) is too weak to guard its package."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_tests: int = Field(20, ge=0, description="Fewest tests the kept suite may hold (tests that pass twice at "
                           "baseline); 0 = no floor.")  # fmt: skip
    max_unusable_files: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Largest share of the sdist's test files that may go unused at baseline (they fail to import or "
        "collect, pass no test, or run slower than max_test_file_s); 1 = any share.",
    )
    min_pass_to_pass: int = Field(
        1, ge=0, description="Fewest PASS_TO_PASS tests a task may list; with none, damage elsewhere still scores 1."
    )
    opening_chars: int = Field(
        500,
        ge=0,
        description="Problem statements alike over their first this many characters tell one problem twice; "
        "0 = not compared.",
    )


class WeakSuiteError(SdistError):
    """A package's test suite, as it runs at baseline, is too small to guard the package: tasks made from it would
    pass validation and still reward damage."""


@dataclass
class SuiteStats:
    """A package's test suite as synthesis ran it at baseline."""

    test_files: int  # the sdist's test files (test_*.py, *_test.py)
    tests: int  # tests kept: passed alone and together
    unusable: dict[str, str] = field(default_factory=dict)  # test file -> why it was not used

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self, limits: SuiteConfig) -> list[str]:
        """What makes this suite too weak under `limits`; empty when none."""
        out = []
        if self.tests < limits.min_tests:
            out.append(
                f"the kept suite holds {self.tests} test{'s' * (self.tests != 1)} (min_tests={limits.min_tests})"
            )
        if self.test_files and len(self.unusable) / self.test_files > limits.max_unusable_files:
            shown = "; ".join(f"{f}: {why}" for f, why in list(self.unusable.items())[:3])
            more = f"; and {len(self.unusable) - 3} more" if len(self.unusable) > 3 else ""
            out.append(
                f"{len(self.unusable)} of {self.test_files} test files do not run at baseline "
                f"(max_unusable_files={limits.max_unusable_files:g}): {shown}{more}"
            )
        return out


def opening(task: Task, chars: int) -> str:
    """The first `chars` characters of a task's problem statement, blanks folded ('' when `chars` is 0)."""
    return " ".join(task.problem_statement.split())[:chars] if chars else ""


def _record(task: Task) -> dict[str, Any] | None:
    synth = dict(task).get("synth")  # an extra field of a task `hrl tasks synth` made
    return synth if isinstance(synth, dict) else None


def task_problems(tasks: Sequence[Task]) -> dict[str, list[str]]:
    """{instance id: what makes it too weak} for each task `hrl tasks synth` made, under the limits it was made with
    (the defaults for a task from before they were recorded): its suite, its PASS_TO_PASS, and a problem statement
    that opens as another task's of the same package does. Tasks with no problem, or not synthesized, are left out."""
    synthesized = [(t, rec) for t in tasks if (rec := _record(t)) is not None]
    limits = {t.instance_id: _limits((rec.get("suite") or {}).get("limits") or {}) for t, rec in synthesized}
    alike: dict[tuple[str, str], list[str]] = defaultdict(list)
    for t, _ in synthesized:
        if text := opening(t, limits[t.instance_id].opening_chars):
            alike[(t.repo, text)].append(t.instance_id)
    out: dict[str, list[str]] = {}
    for t, rec in synthesized:
        mine = limits[t.instance_id]
        suite = rec.get("suite") or {}
        found = (
            SuiteStats(suite["test_files"], suite["tests"], suite.get("unusable") or {}).problems(mine) if suite else []
        )
        if len(t.PASS_TO_PASS) < mine.min_pass_to_pass:
            found.append(
                f"{len(t.PASS_TO_PASS)} PASS_TO_PASS tests (min_pass_to_pass={mine.min_pass_to_pass}): a patch that "
                "breaks the rest of the package still scores 1"
            )
        others = [i for i in alike.get((t.repo, opening(t, mine.opening_chars)), []) if i != t.instance_id]
        if others and mine.opening_chars:
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            found.append(
                f"its problem statement opens as {_others(len(others))} (first {mine.opening_chars} characters: "
                f"{', '.join(others[:3])}{more}): an agent cannot tell them apart"
            )
        if found:
            out[t.instance_id] = found
    return out


def _limits(recorded: dict[str, Any]) -> SuiteConfig:
    """The limits a task was made with; a key this version does not know is left out (the default stands in)."""
    return SuiteConfig(**{k: v for k, v in recorded.items() if k in SuiteConfig.model_fields})


def _others(n: int) -> str:
    return "another task's does" if n == 1 else f"{n} other tasks' do"
