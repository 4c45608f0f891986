"""`hrl tasks synth` on a package whose suite cannot guard it: refused (exit 1, one `Error:` naming the tests kept
and the test files that do not import, one `Hint:` naming options that exist, no task file). With
`--allow-weak-suite` the tasks are written and the problems are warnings on stderr and `problems` in `--json`; then
`hrl tasks check` classes each task `weak_suite`, naming its problems, and exits 1. A bad `-c` is a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_error_policy import USAGE, _check_hint, run_hrl
from tests.runners.tasks.test_synth import weak_sdist

SLACK = ["-c", "max_test_file_s=600", "-c", "max_task_test_s=600"]  # timing never decides here


def _lines(err: str, prefix: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(prefix)]


@pytest.mark.docker
def test_a_weak_suite_is_refused_then_written_and_flagged(swe_image: str, tmp_path: Path, monkeypatch, capsys):
    sdist, out = weak_sdist(tmp_path), tmp_path / "small.jsonl"
    argv = ["tasks", "synth", "--package", "small", "--sdist", str(sdist), "--n", "2", "--out", str(out), *SLACK]
    env = {"HRL_CACHE": str(tmp_path / "cache")}
    code, stdout, err = run_hrl(argv, env, monkeypatch, capsys)
    errors, hints = _lines(err, "Error: "), _lines(err, "Hint: ")
    assert code == 1 and len(errors) == 1 and len(hints) == 1 and stdout == "", err
    assert "the kept suite holds 3 tests (min_tests=20)" in errors[0]
    assert (
        "2 of 3 test files do not run at baseline" in errors[0] and "tests/test_lexer.py: does not import" in errors[0]
    )
    assert not _lines(err, "Warning: ") and not out.exists()
    _check_hint(hints[0].removeprefix("Hint: "), argv, monkeypatch, capsys)

    code, stdout, err = run_hrl([*argv, "--allow-weak-suite", "--json"], env, monkeypatch, capsys)
    assert code == 0, err
    warnings = _lines(err, "Warning: weak test suite: ")
    assert len(warnings) == 2 and "the kept suite holds 3 tests" in warnings[0], err
    rows = json.loads(stdout)
    assert rows and len(rows) == len(out.read_text().splitlines())
    assert all(r["problems"][0] == "the kept suite holds 3 tests (min_tests=20)" for r in rows), rows

    code, stdout, err = run_hrl(["tasks", "check", str(out), "--runs", "1", "--json"], env, monkeypatch, capsys)
    checks = [json.loads(line) for line in stdout.splitlines()]
    assert code == 1 and [c["status"] for c in checks] == ["weak_suite"] * len(rows), err
    assert all(c["gold_rewards"] == [1.0] and c["noop_rewards"] == [0.0] for c in checks)  # graded fine
    assert checks[0]["problems"][:2] == rows[0]["problems"][:2]


def test_a_bad_synthesis_setting_is_a_usage_error(tmp_path: Path, monkeypatch, capsys):
    argv = ["tasks", "synth", "--package", "x", "--out", str(tmp_path / "o.jsonl"), "--sandbox", "local"]
    code, _out, err = run_hrl([*argv, "-c", "suite.min_testz=3"], {}, monkeypatch, capsys)
    assert code == USAGE and "suite.min_testz" in _lines(err, "Error: ")[0], err
    code, _out, err = run_hrl([*argv, "-c", "suite.min_tests=-1"], {}, monkeypatch, capsys)
    assert code == USAGE and "suite.min_tests" in _lines(err, "Error: ")[0], err
