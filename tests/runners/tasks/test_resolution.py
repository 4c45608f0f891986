"""hrl resolves SWE-bench-family rows exactly as the official `swebench` package does, over recorded test logs of
each evaluation type and runner family (django, sympy, pytest, and a FAIL_ONLY JavaScript repository).

Each case is a log in the exact format its repository's parser reads: the recorded runs of
`fixtures/swebench/` (real eval scripts in built images, without the fix) and trimmed real-format logs in
`fixtures/resolution/` (README there). hrl's side is the verifier's own path: `parse_log` then `score_tests`. The
official side is the package's `get_eval_report` over the log file, called directly, whose report is then
checked against hrl's counts; a divergence on any case fails here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_TO_EXT
from swebench.harness.grading import get_eval_report, get_resolution_status
from swebench.harness.test_spec import test_spec as spec_module  # its TestSpec is no pytest class

from hrl.runners.tasks.swebench import adapt_row, lists_only_failures, parse_log
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.verifier import TestVerifierConfig, score_tests
from tests.runners.tasks.swebench_images import DJANGO, FLASK, SYMPY

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = [(f.repo, f.version, f.fail_to_pass, f.pass_to_pass) for f in (DJANGO, FLASK, SYMPY)]
TEXTOPS = "textops_tests.tests.InitialsTests"
QUANTITY = "astropy/units/tests/test_quantity_ufuncs.py"
LEXER_PARAGRAPH = "Lexer paragraph should not break on a heading without a space"
MARKED = (  # FAIL_TO_PASS, PASS_TO_PASS of the marked rows
    [LEXER_PARAGRAPH, "Lexer inline should keep escaped brackets"],
    ["Lexer code should lex indented code", "Parser block should render a heading"],
)


@dataclass(frozen=True)
class Case:
    log: str  # under fixtures/
    repo: str
    version: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]

    def row(self) -> dict[str, object]:
        """The case as a dataset row (test lists as JSON strings, as the datasets store them)."""
        return {
            "repo": self.repo, "instance_id": f"{self.repo.replace('/', '__')}-{Path(self.log).stem}",
            "base_commit": "0" * 40, "version": self.version, "patch": "", "problem_statement": "p",
            "test_patch": "diff --git a/t b/t\n", "FAIL_TO_PASS": json.dumps(self.fail_to_pass),
            "PASS_TO_PASS": json.dumps(self.pass_to_pass),
        }  # fmt: skip


CASES = [
    *(Case(f"swebench/{r.split('/')[1]}.log", r, v, f2p, p2p) for r, v, f2p, p2p in RECORDED),
    Case("resolution/django-skipped.log", "django/django", "5.0",
         [f"test_extra_spaces ({TEXTOPS}.test_extra_spaces)"],
         [f"test_two_words ({TEXTOPS}.test_two_words)", f"test_unicode ({TEXTOPS}.test_unicode)"]),
    Case("resolution/sympy-resolved.log", "sympy/sympy", "1.13", ["test_fraction"], ["test_integers"]),
    Case("resolution/sympy-error.log", "sympy/sympy", "1.13", ["test_fraction"], ["test_integers"]),
    Case("resolution/astropy-partial.log", "astropy/astropy", "5.1",
         [f"{QUANTITY}::TestUfuncReturnsNotImplemented::test_duck",
          f"{QUANTITY}::TestUfuncReturnsNotImplemented::test_basic"],
         [f"{QUANTITY}::test_scalar_add", f"{QUANTITY}::test_nan_to_num_complex"]),
    Case("resolution/requests-resolved.log", "psf/requests", "2.0",
         ["test_requests.py::test_prepared_request_complete_copy[http://example.com/path?a=1]"],
         ["test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE",
          "test_requests.py::RequestsTestCase::test_params_are_merged_case_sensitive",
          "test_requests.py::test_urllib3_retries"]),
    *(Case(f"resolution/marked-{name}.log", "markedjs/marked", "4.1", *MARKED) for name in
      ("resolved", "partial", "clean")),
]  # fmt: skip


def official(case: Case) -> dict[str, object]:
    """The package's own report on the case's log: `get_eval_report`, as `run_evaluation` calls it per instance."""
    row = case.row()
    spec = spec_module.TestSpec(
        instance_id=str(row["instance_id"]), repo=case.repo, version=case.version, repo_script_list=[],
        eval_script_list=[], env_script_list=[], arch="x86_64", FAIL_TO_PASS=case.fail_to_pass,
        PASS_TO_PASS=case.pass_to_pass, language=MAP_REPO_TO_EXT[case.repo], docker_specs={}, namespace=None,
    )  # fmt: skip
    prediction = {"instance_id": spec.instance_id, "model_patch": "diff", "model_name_or_path": "m"}
    report: dict[str, object] = get_eval_report(spec, prediction, str(FIXTURES / case.log), True)[spec.instance_id]
    return report


def task_of(case: Case) -> Task:
    return Task.model_validate(adapt_row(case.row()))


@pytest.mark.parametrize("case", CASES, ids=lambda c: Path(c.log).stem)
def test_hrl_resolves_each_log_as_the_official_package(case: Case) -> None:
    task = task_of(case)
    assert task.grader == "swebench"
    log = (FIXTURES / case.log).read_text()
    results = parse_log(task, log)
    assert results or lists_only_failures(task, log)  # the verifier grades it (an empty parse is an error else)
    verdict = score_tests(task, results, TestVerifierConfig())
    want = official(case)
    assert want["patch_successfully_applied"]  # the package found the test output in the log
    tests_status = want["tests_status"]
    assert isinstance(tests_status, dict)
    resolution = verdict.reward_info["resolution"]
    assert resolution["rule"] == "official"
    assert verdict.success is want["resolved"]
    assert verdict.reward == float(bool(want["resolved"]))
    assert resolution["status"] == get_resolution_status(tests_status)
    assert resolution["eval_type"] == ("fail_only" if case.repo in FAIL_ONLY_REPOS else "pass_and_fail")
    decided = {t for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for v in tests_status[k].values() for t in v}
    assert resolution.get("left_out", []) == [t for t in case.fail_to_pass + case.pass_to_pass if t not in decided]
    for key, counts in (("FAIL_TO_PASS", "fail_to_pass"), ("PASS_TO_PASS", "pass_to_pass")):
        assert verdict.reward_info[counts]["passed"] == len(tests_status[key]["success"]), key
    # partial reward: the share of the tests the report counted that succeeded (1 when it counted none)
    ok = sum(len(tests_status[k]["success"]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS"))
    bad = sum(len(tests_status[k]["failure"]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS"))
    partial = score_tests(task, results, TestVerifierConfig(reward="partial"))
    assert partial.reward == (ok / (ok + bad) if ok + bad else 1.0)
    assert partial.success is verdict.success  # shaping the reward never changes success


def test_the_cases_cover_every_status_and_evaluation_type() -> None:
    """The fixtures exercise what they claim: all three statuses, both evaluation types, per runner family."""
    seen = {(c.repo, str(official(c)["resolved"])) for c in CASES}
    for repo in ("django/django", "sympy/sympy", "markedjs/marked"):
        assert {(repo, "True"), (repo, "False")} <= seen, repo
    statuses = {score_tests(task_of(c), parse_log(task_of(c), (FIXTURES / c.log).read_text()),
                            TestVerifierConfig()).reward_info["resolution"]["status"] for c in CASES}  # fmt: skip
    assert statuses == {"RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"}


@pytest.mark.parametrize(
    ("log", "why"),
    [("django-skipped", "a SKIPPED PASS_TO_PASS test"), ("marked-resolved", "FAIL_ONLY: tests that did not fail")],
)
def test_where_the_strict_rule_differs_it_is_named(log: str, why: str) -> None:
    """A skipped test is left out officially (resolved) and fails hrl's strict rule; a FAIL_ONLY repository's
    parser lists only failures, so its passing tests are absent: resolved officially, failed strictly."""
    case = next(c for c in CASES if Path(c.log).stem == log)
    task = task_of(case)
    results = parse_log(task, (FIXTURES / case.log).read_text())
    official_verdict = score_tests(task, results, TestVerifierConfig())
    strict = score_tests(task, results, TestVerifierConfig(resolution="strict"))
    assert official(case)["resolved"] and official_verdict.success and official_verdict.reward == 1.0, why
    assert strict.success is False and strict.reward == 0.0, why
    assert strict.reward_info["resolution"] == {"rule": "strict"}
    left_out = official_verdict.reward_info["resolution"].get("left_out", [])
    assert left_out == ([f"test_unicode ({TEXTOPS}.test_unicode)"] if log == "django-skipped" else [])


def test_a_swesmith_row_is_resolved_as_the_swesmith_harness_does() -> None:
    """SWE-smith's harness has its own report function (PASS_AND_FAIL); hrl calls it, and agrees with its
    `get_eval_report` over the recorded grading log of the bug state (fixtures/swesmith/oauthlib.log)."""
    from swesmith.harness.grading import get_eval_report as smith_eval_report

    from hrl.runners.tasks import swesmith
    from tests.runners.tasks.swebench_images import OAUTHLIB

    row = OAUTHLIB.row("0" * 40)
    task = Task.model_validate(adapt_row(row))
    log = FIXTURES / "swesmith" / "oauthlib.log"
    verdict = score_tests(task, swesmith.parse_log(task, log.read_text()), TestVerifierConfig())
    inst = {**row, "FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    want = smith_eval_report({"model_patch": "diff"}, inst, str(log))
    assert verdict.success is want["resolved"] is False
    assert verdict.reward_info["resolution"]["package"].startswith("swesmith ")
    assert verdict.reward_info["resolution"]["status"] == get_resolution_status(want["tests_status"])
