"""A synthesized task set whose tests cannot guard its package is named weak, problem by problem, and `hrl tasks
check` classes its tasks `weak_suite` (not ok, so train and eval leave them out) even though their gold scores 1 and
no change scores 0. The weak set is the one `hrl tasks synth --package jmespath` made: a suite of 1 test (5 of the
sdist's 6 test files do not import), no PASS_TO_PASS, and problem statements that open alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.tasks import task_checks
from hrl.runners.tasks.suite import SuiteConfig, SuiteStats, task_problems
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.task_checks import (
    STATUSES,
    TaskCheckResult,
    check_tasks,
    content_hash,
    filter_checked,
    judged,
    read_check,
)
from tests.runners.tasks.test_task_checks import _task

IMPORT_ERROR = "does not import: ImportError: cannot import name 'unittest' from 'tests' (unknown location)"
JMESPATH = {  # the suite `hrl tasks synth --package jmespath --version 1.1.0` kept at baseline
    "test_files": 6,
    "tests": 1,
    "unusable": {f"tests/test_{n}.py": IMPORT_ERROR for n in ("compliance", "functions", "lexer", "parser", "search")},
}
SAME = "After a recent change to `m` (1.0), 1 test of its test suite fails:\n\n- tests/test_m.py::test_fix\n\n"


def synthesized(task: Task, suite: dict[str, Any] | None = None, statement: str = "", **limits: Any) -> Task:
    """`task` as `hrl tasks synth` writes one: its `synth` record with the suite measured and its limits."""
    record = {"source": "hrl tasks synth", "seed": 0, "mutation": "m", "kind": "operator"}
    if suite is not None:
        record["suite"] = {**suite, "limits": SuiteConfig(**limits).model_dump()}
    update = {"problem_statement": statement} if statement else {}
    return Task.model_validate({**task.model_dump(), **update, "synth": record})


def test_a_suite_is_weak_below_each_limit() -> None:
    weak = SuiteStats(**JMESPATH).problems(SuiteConfig())
    assert weak[0] == "the kept suite holds 1 test (min_tests=20)"
    assert weak[1].startswith(
        "5 of 6 test files do not run at baseline (max_unusable_files=0.5): tests/test_compliance.py"
    )
    assert IMPORT_ERROR in weak[1] and weak[1].endswith("and 2 more")
    assert SuiteStats(12, 400, {"tests/test_slow.py": "slower than max_test_file_s=30"}).problems(SuiteConfig()) == []
    # the limits are settings: lowered, the same suite passes
    assert SuiteStats(**JMESPATH).problems(SuiteConfig(min_tests=1, max_unusable_files=1)) == []


def test_the_jmespath_set_is_named_weak_task_by_task() -> None:
    base = _task("t")
    weak = [
        synthesized(
            base.model_copy(update={"instance_id": f"pypi__m-1.0-{i}", "PASS_TO_PASS": []}), JMESPATH, SAME + "same"
        )
        for i in range(3)
    ]
    problems = task_problems(weak)
    assert sorted(problems) == [t.instance_id for t in weak]
    first = problems["pypi__m-1.0-0"]
    assert first[0] == "the kept suite holds 1 test (min_tests=20)"
    assert first[1].startswith("5 of 6 test files do not run at baseline")
    assert first[2].startswith("0 PASS_TO_PASS tests (min_pass_to_pass=1)")
    assert first[3].startswith("its problem statement opens as 2 other tasks' do (first 500 characters: pypi__m-1.0-1")


def test_a_sound_set_and_tasks_not_synthesized_have_no_problem() -> None:
    sound = {"test_files": 4, "tests": 120, "unusable": {}}
    tasks = [
        synthesized(_task("a"), sound, SAME + "a: assert 1 == 2"),
        synthesized(_task("b"), sound, SAME.replace("test_fix", "test_other") + "b"),
        _task("not-synthesized-1").model_copy(update={"PASS_TO_PASS": []}),  # SWE-bench tasks: not judged here
        _task("not-synthesized-2").model_copy(update={"PASS_TO_PASS": []}),
    ]
    assert task_problems(tasks) == {}
    # a task synthesized before the suite was recorded: judged by what it lists, under the default limits
    old = [synthesized(_task(f"old-{i}").model_copy(update={"PASS_TO_PASS": []}), None, SAME) for i in range(2)]
    assert [p[0].split(" (")[0] for p in task_problems(old).values()] == ["0 PASS_TO_PASS tests"] * 2


def test_check_classes_a_weak_synthesized_task_weak_suite(tmp_path: Path) -> None:
    """Graded for real (local sandboxes): gold 1, no change 0, as `ok` would be; the suite makes it weak_suite."""
    weak = synthesized(_task("weak"), JMESPATH)
    sound = synthesized(_task("sound", gold="def f(x):\n    return x + 1\n# sound\n"), {**JMESPATH, "tests": 40}, "fix f",
                        min_tests=20, max_unusable_files=1)  # fmt: skip
    cache = tmp_path / "cache"
    results = {r.instance_id: r for r in check_tasks([weak, sound], runs=1, sandbox="local", cache=cache)}
    assert "weak_suite" in STATUSES
    assert results["weak"].gold_rewards == [1.0] and results["weak"].noop_rewards == [0.0]
    assert results["weak"].status == "weak_suite", results["weak"].problems
    assert results["weak"].problems[0] == "the kept suite holds 1 test (min_tests=20)"
    assert results["sound"].status == "ok", results["sound"].problems
    kept, report = filter_checked([weak, sound], cache=cache)  # what train and eval use
    assert [t.instance_id for t in kept] == ["sound"] and report.left_out == {"weak": "weak_suite"}


def test_a_cached_ok_is_judged_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task checked `ok` before the suite was judged: the next check (from the cache, nothing graded) names it
    weak_suite and writes that where train reads it; a weak_suite whose problems are gone is ok again."""
    weak = synthesized(_task("weak"), JMESPATH)
    cache = tmp_path / "cache"
    cache.mkdir()
    before = TaskCheckResult("weak", content_hash(weak), "ok", 2, "local", [1.0, 1.0], [0.0, 0.0], hrl_version="x")
    (cache / f"{before.content_hash.removeprefix('sha256:')}.json").write_text(json.dumps(before.to_dict()))
    monkeypatch.setattr(task_checks, "_version", lambda: "x")  # the cached result is this hrl version's
    [again] = check_tasks([weak], runs=2, sandbox="local", cache=cache)
    assert again.cached and again.status == "weak_suite"
    assert read_check(before.content_hash, cache).status == "weak_suite"  # type: ignore[union-attr]
    assert judged(again, []).status == "ok" and judged(again, []).problems == []
    assert judged(TaskCheckResult("f", "h", "flaky", 2, "local"), ["weak"]).status == "flaky"  # grading comes first
