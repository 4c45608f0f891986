"""SWE-smith rows: loading as they are, the bug as the base state and its reverse as the gold, the swesmith
package's profile test command, and its log parser over a recorded log (no Docker; `test_swesmith_docker.py`
grades a row in an image)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hrl.runners.errors import PrerequisiteError
from hrl.runners.tasks import load_tasks
from hrl.runners.tasks.patches import file_diff, join_patches
from hrl.runners.tasks.swesmith import command, parse_log, profile_for, reverse_diff
from tests.runners.tasks.swebench_images import OAUTHLIB

LOGS = Path(__file__).parent / "fixtures" / "swesmith"
IMAGE = "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"


def test_rows_load_as_they_are_from_jsonl_and_parquet(tmp_path: Path) -> None:
    row = OAUTHLIB.row("")
    no_image = {k: v for k, v in row.items() if k != "image_name"} | {"instance_id": row["instance_id"] + "2"}
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(no_image) + "\n")
    pq.write_table(pa.Table.from_pylist([row, {**no_image, "image_name": None}]), tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.parquet"):
        for task in load_tasks(tmp_path / name):
            assert task.grader == "swesmith" and task.image == IMAGE, name  # a row without one: its profile's
            assert task.FAIL_TO_PASS == ["tests/test_common.py::test_quote"] and not task.test_patch
            assert task.gold_patch == reverse_diff(task.patch) != task.patch


def test_the_gold_is_the_bug_reversed(tmp_path: Path) -> None:
    """Applied with git: bug then its reverse gives the clean tree back, file creation and deletion included."""
    clean = {"a.py": "x = 1\ny = 2\n", "gone.py": "old\n", "d/keep.txt": "k\n"}
    buggy = {"a.py": "x = 1\ny = 3\n", "new.py": "fresh\n"}
    bug = join_patches(
        [file_diff("a.py", clean["a.py"], buggy["a.py"]), file_diff("gone.py", clean["gone.py"], None),
         file_diff("new.py", None, buggy["new.py"])]
    )  # fmt: skip
    for path, text in clean.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    def git(*args: str, stdin: str | None = None) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], input=stdin, text=True, check=True, capture_output=True)

    git("init", "-q")
    git("apply", "-", stdin=bug)
    assert (tmp_path / "new.py").exists() and not (tmp_path / "gone.py").exists()
    git("apply", "-", stdin=reverse_diff(bug))
    assert {p: (tmp_path / p).read_text() for p in clean} == clean and not (tmp_path / "new.py").exists()
    assert reverse_diff(reverse_diff(bug)) == bug


def test_the_command_is_the_profiles_between_the_markers() -> None:
    (task,) = _tasks()
    profile = profile_for(task.model_dump())
    script = command(task)
    assert profile.test_cmd in script  # the package's (conda activate testbed; pytest … --verbose)
    lines = script.splitlines()
    start, end = lines.index(": '>>>>> Start Test Output'"), lines.index(": '>>>>> End Test Output'")
    assert lines.index("git checkout -- tests/test_common.py 2>/dev/null || true") < start < end
    assert lines[start + 1] == profile.test_cmd


def test_the_profiles_parser_reads_a_recorded_log() -> None:
    """fixtures/swesmith/oauthlib.log: the grading output of the bug state in the image (recorded there)."""
    (task,) = _tasks()
    results = parse_log(task, (LOGS / "oauthlib.log").read_text())
    assert results == {"tests/test_common.py::test_quote": "FAILED", "tests/test_common.py::test_unquote": "PASSED"}


def test_a_repository_without_a_profile_says_so() -> None:
    with pytest.raises(PrerequisiteError) as info:
        profile_for({"instance_id": "nobody__nothing.12345678.x", "repo": "swesmith/nobody__nothing.12345678"})
    assert "no profile for swesmith/nobody__nothing.12345678" in str(info.value) and info.value.hint


def _tasks() -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_text(json.dumps(OAUTHLIB.row("")) + "\n")
        return load_tasks(path)
