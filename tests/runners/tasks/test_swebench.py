"""SWE-bench-family rows: loading as they are, image names, the official package's eval scripts, and its log parsers
over recorded logs of real runners (no Docker needed; `test_swebench_docker.py` grades them in images)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

from hrl.runners.tasks import load_tasks
from hrl.runners.tasks.swebench import adapt_row, eval_script, image_for, parse_log
from hrl.runners.tasks.task import Task
from tests.runners.tasks.swebench_images import DJANGO, FIXTURES, FLASK, SYMPY

LOGS = Path(__file__).parent / "fixtures" / "swebench"
TEST_PATCH = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n x\n+y\n"


def row(**fields: object) -> dict[str, object]:
    """A SWE-bench Verified row as the dataset stores it (test lists as JSON strings)."""
    base = {
        "repo": "django/django", "instance_id": "django__django-11099", "base_commit": "d26b242", "version": "3.0",
        "patch": "diff --git a/a b/a\n", "test_patch": TEST_PATCH, "problem_statement": "UsernameValidator …",
        "hints_text": "", "created_at": "2019-03-20T03:46:18Z", "FAIL_TO_PASS": '["test_a (x.T)"]',
        "PASS_TO_PASS": "[]", "environment_setup_commit": "419a78300f",
    }  # fmt: skip
    return {**base, **fields}


def test_rows_load_as_they_are_from_jsonl_json_and_parquet(tmp_path: Path) -> None:
    rows = [row(), row(instance_id="getmoto__moto-7365", repo="getmoto/moto", version=5.0, FAIL_TO_PASS=["t::a"])]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.json").write_text(json.dumps(rows))
    parquet_rows = [{**r, "version": str(r["version"]), "FAIL_TO_PASS": json.dumps(["t::a"])} for r in rows]
    pq.write_table(pa.Table.from_pylist(parquet_rows), tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.json", "t.parquet"):
        django, moto = load_tasks(tmp_path / name)
        assert django.grader == moto.grader == "swebench", name
        assert django.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
        assert moto.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest"  # SWE-Gym's naming
        assert moto.version == "5.0" and moto.FAIL_TO_PASS == ["t::a"]
        assert django.model_extra and django.model_extra["environment_setup_commit"] == "419a78300f"


def test_a_row_names_its_own_image_and_hrl_rows_keep_the_pytest_grader() -> None:
    smith = {"instance_id": "a__b.1234abcd.func_pm__x", "image_name": "jyangballin/swesmith.x86_64.a_1776_b.1234abcd"}
    assert image_for(smith) == smith["image_name"]
    assert (
        image_for({"instance_id": "x", "docker_image": "namanjain12/aiohttp_final:f0d7"})
        == "namanjain12/aiohttp_final:f0d7"
    )
    assert image_for({"instance_id": "x", "image": "mine:1", "image_name": "theirs:1"}) == "mine:1"
    unknown_version = {"instance_id": "Django__django-1", "repo": "django/django", "version": "0.1"}
    assert image_for(unknown_version) == "swebench/sweb.eval.x86_64.django_1776_django-1:latest"
    native = Task.model_validate({"instance_id": "x", "problem_statement": "p", "FAIL_TO_PASS": ["t.py::a"]})
    assert native.grader == "pytest"
    for fields in ({"test_cmd": "make test"}, {"repo_snapshot": {"a.py": ""}}, {"grader": "pytest"}):
        assert adapt_row(row(**fields)).get("grader") != "swebench", fields


def test_eval_scripts_come_from_the_package_specs() -> None:
    django = Task.model_validate(DJANGO.row("b" * 40) | {"grader": "swebench"})
    script = eval_script(django)
    spec = MAP_REPO_VERSION_TO_SPECS["django/django"]["5.0"]
    assert f"{spec['test_cmd']} textops_tests.tests" in script  # the test patch's module, django-style
    assert spec["install"] in script and "conda activate testbed" in script
    assert f"git checkout {'b' * 40} tests/textops_tests/tests.py" in script
    assert ">>>>> Start Test Output" in script and django.test_patch.strip() in script
    sympy = eval_script(Task.model_validate(SYMPY.row("c" * 40) | {"grader": "swebench"}))
    assert f"{MAP_REPO_VERSION_TO_SPECS['sympy/sympy']['1.13']['test_cmd']} numkit/tests/test_numkit.py" in sympy
    gym = Task.model_validate(row(repo="getmoto/moto", version="5.0", grader="swebench"))
    assert "pytest -rA tests/test_x.py" in eval_script(gym)  # no spec: the package's pytest command
    own = Task.model_validate(row(grader="swebench", eval_script="#!/bin/bash\necho mine\n"))
    assert eval_script(own) == "#!/bin/bash\necho mine\n"  # swebench 5.x rows carry their script


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.repo)
def test_recorded_logs_read_by_the_package_parser(fixture: object) -> None:
    """Each log is a real run of the eval script without the fix (fixtures/swebench/README.md): FAIL_TO_PASS
    fails (django's test errors), PASS_TO_PASS passes; the part outside the markers (the install step, git) is not
    read."""
    task = Task.model_validate(fixture.row("0" * 40) | {"grader": "swebench"})  # type: ignore[attr-defined]
    log = (LOGS / f"{task.repo.split('/')[1]}.log").read_text()
    results = parse_log(task, log)
    failed = "ERROR" if task.repo == "django/django" else "FAILED"
    assert {t: results.get(t) for t in task.FAIL_TO_PASS} == dict.fromkeys(task.FAIL_TO_PASS, failed)
    assert {t: results.get(t) for t in task.PASS_TO_PASS} == dict.fromkeys(task.PASS_TO_PASS, "PASSED")
    outside = log.split(">>>>> Start Test Output")[0]
    assert parse_log(task, outside + ">>>>> Start Test Output\n>>>>> End Test Output\n") == {}


def test_parser_families_differ() -> None:
    """The same outcome in three runners' words, each read only by its repository's parser."""
    flask = Task.model_validate(FLASK.row("0" * 40) | {"grader": "swebench"})
    django = Task.model_validate(DJANGO.row("0" * 40) | {"grader": "swebench"})
    sympy = Task.model_validate(SYMPY.row("0" * 40) | {"grader": "swebench"})
    assert parse_log(flask, "PASSED tests/t.py::test_a\n") == {"tests/t.py::test_a": "PASSED"}
    assert parse_log(django, "test_a (m.T.test_a) ... ok\n") == {"test_a (m.T.test_a)": "PASSED"}
    assert parse_log(sympy, "test_a ok\ntest_b F\n") == {"test_a": "PASSED", "test_b": "FAILED"}
    assert parse_log(sympy, "PASSED tests/t.py::test_a\n") == {}
