"""SWE-bench-family rows as tasks, graded the way the official `swebench` package grades them.

Rows of SWE-bench (Verified, Lite, Multimodal), SWE-Gym, SWE-smith and R2E-Gym load as they are (`adapt_row`).
A SWE-smith row gets `grader: swesmith` (its `patch` is the bug; see `swesmith.py`), an R2E-Gym row `grader: r2egym`
(its expected test output; see `r2egym.py`). Otherwise a row without `repo_snapshot` and `test_cmd` that carries a `base_commit` and a `test_patch` gets
`grader: swebench`, a `version` as text, and the image its dataset names:

- the row's own `image`, `image_name` (SWE-smith, SWE-Gym exports) or `docker_image` (R2E-Gym, SWE-rebench);
- else, for a repository the package knows: SWE-bench's `swebench/sweb.eval.x86_64.<id>:latest`, `__` written
  `_1776_`, lower case;
- else SWE-Gym's `xingyaoww/sweb.eval.x86_64.<id>:latest`, `__` written `_s_`, lower case.

Grading (`eval_script`, `parse_log`) takes everything from the package (`hrl[swebench]`, swebench 4.x, whose
`MAP_REPO_VERSION_TO_SPECS` still holds the per-repository specs; 5.x moved them into the datasets' own
`eval_script` column, which a row may carry too): the eval script its test spec builds for the repository and
version (activate the `testbed` environment, the repository's install step, reset the test files, apply the test
patch, the repository's test command between the `>>>>> Start/End Test Output` markers), and the log parser of
`MAP_REPO_TO_PARSER` over the log between the markers (the whole log when nothing between them reads, as the
package's `get_logs_eval` falls back). A repository the package does not know (SWE-Gym's) runs the package's own
pytest command (`pytest -rA`) in the same script shape and is read by its pytest parser.

Resolution (`resolve`) is the package's too: `get_eval_tests_report` with the evaluation type `get_eval_report` picks
(`FAIL_ONLY` for the repositories in `FAIL_ONLY_REPOS`, SWE-bench Multimodal's JavaScript ones whose parsers list only
failing tests: a test fails only when it reads FAILED; else `PASS_AND_FAIL`: PASSED/XFAIL succeed, FAILED/ERROR or
absent fail, anything else, SKIPPED among them, is left out), then `get_resolution_status`. A SWE-smith row is
resolved by the swesmith package's own `get_eval_tests_report` (the same PASS_AND_FAIL rule, its copy).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from typing import Any

from hrl.runners.errors import PrerequisiteError
from hrl.runners.tasks.r2egym import adapt as r2e_adapt
from hrl.runners.tasks.r2egym import is_r2e_row
from hrl.runners.tasks.swesmith import is_smith_row
from hrl.runners.tasks.swesmith import profile_for as _smith_profile

__all__ = [
    "RESOLVED_FULL", "Resolution", "adapt_row", "command", "eval_script", "image_for", "lists_only_failures",
    "parse_log", "require_package", "resolve", "specs_for",
]  # fmt: skip

ENV_NAME = "testbed"
REPO_DIR = "/testbed"
SWEBENCH_NAMESPACE = "swebench"
SWEGYM_NAMESPACE = "xingyaoww"
IMAGE_KEYS = ("image", "image_name", "docker_image")
HINT = "pip install 'hrl[swebench]' (the official swebench package, 4.x)"
RESOLVED_FULL = "RESOLVED_FULL"  # the package's ResolvedStatus.FULL: the task counts as solved


def require_package() -> None:
    """Raise PrerequisiteError unless `swebench` (with its per-repository specs) can be imported."""
    if importlib.util.find_spec("swebench") is None:
        raise PrerequisiteError("SWE-bench rows need the swebench package, which is not installed", hint=HINT)
    if not hasattr(_constants(), "MAP_REPO_VERSION_TO_SPECS"):
        raise PrerequisiteError("the installed swebench has no MAP_REPO_VERSION_TO_SPECS (5.x)", hint=HINT)


@functools.cache
def _constants() -> Any:
    import swebench.harness.constants as constants  # the package's import takes ~2 s (datasets, docker, …)

    return constants


def is_family_row(row: dict[str, Any]) -> bool:
    """A SWE-bench-family row: no hrl snapshot or test command, a base commit and a test patch to grade with."""
    if row.get("grader") not in (None, "swebench") or row.get("repo_snapshot") or row.get("test_cmd"):
        return False
    return row.get("grader") == "swebench" or bool(row.get("base_commit") and row.get("test_patch"))


def adapt_row(row: Any) -> Any:
    """The row as a task: SWE-bench-family rows get `grader`, a text `version` and their image; others unchanged."""
    if not isinstance(row, dict):
        return row
    if is_r2e_row(row):  # graded against its expected test output, by its own test script
        return r2e_adapt(row)
    if is_smith_row(row):  # its `patch` is the bug, its tests and parser are the swesmith package's
        image = row.get("image") or row.get("image_name") or _smith_profile(row).image_name
        return {**row, "grader": "swesmith", "image": image}
    if not is_family_row(row):
        named = next((row[k] for k in IMAGE_KEYS[1:] if row.get(k)), None)
        return {**row, "image": named} if named and not row.get("image") else row
    require_package()
    out = {**row, "grader": "swebench"}
    if out.get("version") is not None and not isinstance(out["version"], str):
        out["version"] = str(out["version"])  # a JSON export may write 3.0 as a number
    if not out.get("image"):
        out["image"] = image_for(out)
    return out


def image_for(row: dict[str, Any]) -> str:
    """The per-instance image the row's dataset names (see the module docstring)."""
    for key in IMAGE_KEYS:
        if row.get(key):
            return str(row[key])
    require_package()
    known = row.get("repo") in _constants().MAP_REPO_VERSION_TO_SPECS  # a SWE-bench repository, whatever the version
    namespace, sep = (SWEBENCH_NAMESPACE, "_1776_") if known else (SWEGYM_NAMESPACE, "_s_")
    key = f"sweb.eval.x86_64.{row['instance_id']}:latest".lower()
    return f"{namespace}/{key.replace('__', sep)}"


def specs_for(row: dict[str, Any]) -> dict[str, Any] | None:
    """The package's spec for the row's repository and version, None when it has none."""
    require_package()
    specs: dict[str, Any] | None = (
        _constants().MAP_REPO_VERSION_TO_SPECS.get(row.get("repo"), {}).get(str(row.get("version")))
    )
    return specs


def eval_script(task: Any) -> str:
    """The bash script that grades `task` in its image (the agent's diff already applied at /testbed)."""
    row = task.model_dump(mode="json")
    if row.get("eval_script"):  # swebench 5.x datasets carry their own
        return str(row["eval_script"])
    specs = specs_for(row)
    if specs is not None:
        from swebench.harness.test_spec.create_scripts import make_eval_script_list

        lines = make_eval_script_list(row, specs, ENV_NAME, REPO_DIR, task.base_commit, task.test_patch)
    else:
        lines = _pytest_script(row, task.base_commit, task.test_patch)
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"


def _pytest_script(row: dict[str, Any], base_commit: str, test_patch: str) -> list[str]:
    """A repository the package has no spec for: its pytest command on the test patch's files, in its script shape."""
    from swebench.harness.test_spec.python import get_test_directives
    from swebench.harness.utils import get_modified_files

    c = _constants()
    files = " ".join(get_modified_files(test_patch))
    reset = f"git checkout {base_commit} {files}" if files else "true"
    apply = f"git apply -v - <<'EOF_114329324912'\n{test_patch}\nEOF_114329324912"
    activate = ["source /opt/miniconda3/bin/activate", f"conda activate {ENV_NAME}"]
    test = " ".join(["pytest -rA", *get_test_directives(row)])
    return [
        *activate,
        f"cd {REPO_DIR}",
        reset,
        apply,
        f": '{c.START_TEST_OUTPUT}'",
        test,
        f": '{c.END_TEST_OUTPUT}'",
        reset,
    ]


def command(task: Any) -> str:
    """`eval_script` with stderr merged into stdout, in order (the markers are `set -x` traces on stderr, and some
    runners, django's among them, report on stderr), as the official harness reads one stream."""
    return "exec 2>&1\n" + eval_script(task)


def parse_log(task: Any, log: str) -> dict[str, str]:
    """{test id: PASSED | FAILED | ERROR | SKIPPED | XFAIL} from an eval script's output, read by the package's parser
    for the repository (its pytest parser for one it does not know), between the test-output markers."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    c = _constants()
    row = task.model_dump(mode="json")
    parser = _named_parser(row.get("log_parser")) or MAP_REPO_TO_PARSER.get(task.repo)
    if parser is None:
        from swebench.harness.log_parsers.python import parse_log_pytest as parser
    spec = _test_spec(row)
    results: dict[str, str] = {}
    if c.START_TEST_OUTPUT in log and c.END_TEST_OUTPUT in log:
        results = parser(log.split(c.START_TEST_OUTPUT, 1)[1].split(c.END_TEST_OUTPUT, 1)[0], spec)
    return results or parser(log, spec)


def lists_only_failures(task: Any, log: str) -> bool:
    """Whether an empty parse of `log` is a clean run: a FAIL_ONLY repository's parser lists failing tests only, so
    a run that reached its test command (the start marker) and failed none reads as nothing."""
    c = _constants()
    return task.repo in c.FAIL_ONLY_REPOS and c.START_TEST_OUTPUT in log


@dataclass(frozen=True)
class Resolution:
    """The package's verdict on one graded run: its status, the evaluation type it used, and its report (per
    FAIL_TO_PASS / PASS_TO_PASS list: the tests that succeeded and those that failed; the rest were left out)."""

    status: str  # RESOLVED_FULL | RESOLVED_PARTIAL | RESOLVED_NO
    eval_type: str  # pass_and_fail | fail_only
    report: dict[str, dict[str, list[str]]]
    package: str  # which package and version decided, e.g. "swebench 4.1.0"

    @property
    def resolved(self) -> bool:
        return self.status == RESOLVED_FULL

    def counts(self, key: str) -> tuple[int, int]:
        """(succeeded, counted) of one list (FAIL_TO_PASS or PASS_TO_PASS); left-out tests are not counted."""
        part = self.report[key]
        return len(part["success"]), len(part["success"]) + len(part["failure"])

    def left_out(self, tests: list[str]) -> list[str]:
        """The listed tests the report neither passed nor failed (a SKIPPED test under PASS_AND_FAIL)."""
        decided = {t for part in self.report.values() for t in part["success"] + part["failure"]}
        return [t for t in tests if t not in decided]


def resolve(task: Any, results: dict[str, str]) -> Resolution:
    """The official resolution of `results` (a log parser's {test: status}) for the task's FAIL_TO_PASS and
    PASS_TO_PASS: the package's `get_eval_tests_report` and `get_resolution_status`, called as `get_eval_report`
    calls them (a SWE-smith row: the swesmith package's report function, as its harness calls it)."""
    from importlib.metadata import version

    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    c = _constants()
    gold = {c.FAIL_TO_PASS: list(task.FAIL_TO_PASS), c.PASS_TO_PASS: list(task.PASS_TO_PASS)}
    if task.grader == "swesmith":
        from swesmith.harness.grading import get_eval_tests_report as smith_report

        report, eval_type, package = smith_report(results, gold), c.EvalType.PASS_AND_FAIL, "swesmith"
    else:
        eval_type = c.EvalType.FAIL_ONLY if task.repo in c.FAIL_ONLY_REPOS else c.EvalType.PASS_AND_FAIL
        report, package = get_eval_tests_report(results, gold, eval_type=eval_type), "swebench"
    return Resolution(get_resolution_status(report), eval_type.value, report, f"{package} {version(package)}")


def _named_parser(name: Any) -> Any:
    """A parser a row names (swebench 5.x rows carry `log_parser`), looked up in the package's parser modules."""
    if not name:
        return None
    import swebench.harness.log_parsers as parsers

    for module in ("python", "javascript", "c", "go", "java", "php", "ruby", "rust"):
        found = getattr(importlib.import_module(f"{parsers.__name__}.{module}"), str(name), None)
        if found is not None:
            return found
    return None


def _test_spec(row: dict[str, Any]) -> Any:
    """The package's TestSpec for parsers that read it (only the fields grading needs; no image is built)."""
    from swebench.harness.test_spec.test_spec import TestSpec

    def tests(key: str) -> list[str]:
        value = row.get(key) or []
        return json.loads(value) if isinstance(value, str) else list(value)

    ext = _constants().MAP_REPO_TO_EXT.get(row.get("repo"), "py")
    return TestSpec(
        instance_id=row["instance_id"], repo=row.get("repo", ""), version=str(row.get("version")),
        repo_script_list=[], eval_script_list=[], env_script_list=[], arch="x86_64",
        FAIL_TO_PASS=tests("FAIL_TO_PASS"), PASS_TO_PASS=tests("PASS_TO_PASS"), language=ext,
        docker_specs={}, namespace=None,
    )  # fmt: skip
