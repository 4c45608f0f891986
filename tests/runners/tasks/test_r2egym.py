"""R2E-Gym's own rows: loading as they are, the gold from the parsed commit, R2E-Gym's parser over a recorded log,
and its exact-match scoring (no Docker; `test_r2egym_docker.py` grades a row in an image)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hrl.runners.tasks import TestVerifier, TestVerifierConfig, load_tasks
from hrl.runners.tasks.patches import file_diff, join_patches
from hrl.runners.tasks.r2egym import command, gold_from_commit, parse_log
from hrl.sandboxes import get_backend
from tests.runners.tasks.swebench_images import R2E_EXPECTED, R2E_FILES, R2E_FIXED, R2E_IMAGE, r2e_row, to_parsed_commit

LOG = Path(__file__).parent / "fixtures" / "r2egym" / "textkit.log"


def _task(tmp_path: Path, **fields: object):
    path = tmp_path / "r2e.jsonl"
    path.write_text(json.dumps({**r2e_row(), **fields}) + "\n")
    (task,) = load_tasks(path)
    return task


def test_rows_load_as_they_are_from_jsonl_and_parquet(tmp_path: Path) -> None:
    row = r2e_row()
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.parquet"):
        (task,) = load_tasks(tmp_path / name)
        assert task.grader == "r2egym" and task.image == R2E_IMAGE, name
        assert task.instance_id == "textkit__" + "1" * 40 and task.repo == "textkit"
        assert task.FAIL_TO_PASS == ["TestTitle.test_shout", "TestTitle.test_words"]
        assert task.PASS_TO_PASS == []
        assert task.patch == join_patches([file_diff(p, R2E_FILES[p], t) for p, t in R2E_FIXED.items()])
        assert task.model_extra and task.model_extra["commit_hash"] == "1" * 40  # R2E-Gym's fields kept


def test_the_gold_is_the_commits_non_test_python_diffs() -> None:
    code = file_diff("pkg/mod.py", "a = 1\n", "a = 2\n")
    tests = file_diff("tests/test_mod.py", "x\n", "y\n") + file_diff("pkg/test_util.py", "x\n", "y\n")
    data = file_diff("pkg/data.txt", "x\n", "y\n")
    assert gold_from_commit(json.dumps(to_parsed_commit(code + tests + data))) == code


def test_the_parser_reads_a_recorded_log_and_scoring_is_exact(tmp_path: Path) -> None:
    """fixtures/r2egym/textkit.log: the test script's output at the base state (recorded in the image)."""
    task = _task(tmp_path)
    results = parse_log(task, LOG.read_text())
    assert results == {"TestTitle.test_shout": "PASSED", "TestTitle.test_words": "FAILED"}
    verifier = TestVerifier(get_backend("local"), TestVerifierConfig())
    assert verifier._score(task, results, {}).reward == 0.0
    assert verifier._score(task, dict(R2E_EXPECTED), {}).reward == 1.0
    extra = {**R2E_EXPECTED, "TestTitle.test_more": "PASSED"}
    assert verifier._score(task, extra, {}).reward == 0.0  # not the expected set: R2E-Gym scores 0
    expects_failure = _task(tmp_path, expected_output_json=json.dumps({**R2E_EXPECTED, "TestTitle.test_x": "FAILED"}))
    with_failure = {**R2E_EXPECTED, "TestTitle.test_x": "FAILED"}
    assert verifier._score(expects_failure, with_failure, {}).reward == 1.0
    assert verifier._score(expects_failure, {**with_failure, "TestTitle.test_x": "PASSED"}, {}).reward == 0.0


def test_the_command_links_the_tests_and_runs_the_images_script(tmp_path: Path) -> None:
    lines = command(_task(tmp_path)).splitlines()
    assert "rm -rf r2e_tests && ln -s /r2e_tests r2e_tests" in lines and lines[-1] == "bash run_tests.sh"
