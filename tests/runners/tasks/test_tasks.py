"""Task format, snapshots, diffs, guards, pytest summaries, mutations, sdists and recipes (no Docker needed)."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hrl.recipes.loader import RecipeError, list_recipes, load_recipe
from hrl.runners.errors import PrerequisiteError
from hrl.runners.tasks import Task, TaskFormatError, load_tasks, task_summary, write_tasks
from hrl.runners.tasks.guards import filter_patch, runner_hooks
from hrl.runners.tasks.mutate import apply_mutation, find_mutations
from hrl.runners.tasks.patches import file_diff, patch_paths, split_patch
from hrl.runners.tasks.results import failure_sections, outcome, parse_summary
from hrl.runners.tasks.sdist import SdistError, read_sdist
from hrl.runners.tasks.task import pack_snapshot, snapshot_files, unpack_snapshot

ROOT = Path(__file__).resolve().parents[3]


def minimal(**fields: object) -> dict[str, object]:
    return {"instance_id": "x-1", "problem_statement": "fix it", "FAIL_TO_PASS": ["t.py::test_a"], **fields}


# -- task files -------------------------------------------------------------------------------------------------


def test_swe_bench_fields_load_and_round_trip(tmp_path: Path) -> None:
    row = minimal(
        repo="astropy/astropy", base_commit="abc123", FAIL_TO_PASS='["t.py::test_a"]', PASS_TO_PASS="[]",
        patch="diff --git a/x b/x\n", test_patch="", hints_text="", environment_setup_commit="def",
    )  # fmt: skip
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n\n")
    [task] = load_tasks(tmp_path / "t.jsonl")
    assert task.FAIL_TO_PASS == ["t.py::test_a"] and task.PASS_TO_PASS == []
    assert task.model_extra == {"hints_text": "", "environment_setup_commit": "def"}  # unknown fields kept
    write_tasks([task], tmp_path / "out.jsonl")
    assert load_tasks(tmp_path / "out.jsonl") == [task]
    (tmp_path / "t.json").write_text(json.dumps([row]))
    assert load_tasks(tmp_path / "t.json") == [task]
    assert task_summary(task)["fail_to_pass"] == 1


def test_bad_task_files_name_file_line_and_instance(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(minimal()) + "\n" + json.dumps({"instance_id": "y", "FAIL_TO_PASS": []}) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:2: task 'y' is not valid: problem_statement"):
        load_tasks(bad)
    bad.write_text("{nope\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:1: not JSON"):
        load_tasks(bad)
    bad.write_text(json.dumps(minimal()) + "\n" + json.dumps(minimal()) + "\n")
    with pytest.raises(TaskFormatError, match="duplicate instance_id 'x-1'"):
        load_tasks(bad)
    with pytest.raises(TaskFormatError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_an_empty_repo_snapshot_is_a_task_format_error(tmp_path: Path) -> None:
    """`repo_snapshot: ""` is no archive: refused naming the file, line, task and field when the file is read (before,
    a sandbox failed to unpack it mid-run and the CLI called it a bug in hrl)."""
    bad = tmp_path / "bad.jsonl"
    for empty in ("", "  "):
        bad.write_text(json.dumps(minimal(repo_snapshot=empty)) + "\n")
        with pytest.raises(TaskFormatError, match=r"bad\.jsonl:1: task 'x-1' is not valid: repo_snapshot: is an empty"):
            load_tasks(bad)
    bad.write_text(json.dumps(minimal(repo_snapshot=pack_snapshot({"a.py": b"x = 1\n"}))) + "\n")
    assert load_tasks(bad)[0].repo_snapshot  # a real one loads


def test_parquet_without_pyarrow_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed: the import fails
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    with pytest.raises(PrerequisiteError, match="needs pyarrow"):
        load_tasks(tmp_path / "t.parquet")


def test_parquet_loads(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([minimal(PASS_TO_PASS='["t.py::test_b"]')]), tmp_path / "t.parquet")
    [task] = load_tasks(tmp_path / "t.parquet")
    assert task.PASS_TO_PASS == ["t.py::test_b"]


def test_default_test_command_runs_the_listed_files() -> None:
    task = Task.model_validate(minimal(PASS_TO_PASS=["b dir/t2.py::test_b[x]", "t.py::test_c"]))
    assert task.resolved_test_cmd().endswith("-o addopts='' 'b dir/t2.py' t.py")
    assert Task.model_validate(minimal(test_cmd="make test")).resolved_test_cmd() == "make test"


def test_snapshots_are_deterministic_and_safe(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": b"x = 1\n", ".gitignore": b"*.pyc\n", "data/\xc3\xa9.txt".encode().decode(): b"\xff"}
    packed = pack_snapshot(files)
    assert packed == pack_snapshot(dict(reversed(files.items())))
    assert snapshot_files(packed) == files
    assert unpack_snapshot({"a/b.txt": "hi"}, tmp_path) == ["a/b.txt"]
    assert (tmp_path / "a/b.txt").read_text() == "hi"
    for evil in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(TaskFormatError, match="unsafe path"):
            snapshot_files({evil: "x"})
    with pytest.raises(TaskFormatError, match=r"not base64 tar\.gz"):
        snapshot_files("not a snapshot!")


# -- diffs ------------------------------------------------------------------------------------------------------


def git_apply(tmp_path: Path, files: dict[str, str], diff: str) -> dict[str, str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "p.diff").unlink()
    return {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}


def test_file_diffs_apply_with_git(tmp_path: Path) -> None:
    diff = "".join(
        [
            file_diff("a.py", "x = 1\ny = 2", "x = 1\ny = 3\n"),  # no newline at the end before
            file_diff("new/b.py", None, "print('b')\n"),
            file_diff("gone.txt", "bye\n", None),
            file_diff("empty/__init__.py", None, ""),
        ]
    )
    assert patch_paths(diff) == ["a.py", "new/b.py", "gone.txt", "empty/__init__.py"]
    assert [p.kind for p in split_patch(diff)] == ["modified", "new", "deleted", "new"]
    out = git_apply(tmp_path, {"a.py": "x = 1\ny = 2", "gone.txt": "bye\n"}, diff)
    assert out == {"a.py": "x = 1\ny = 3\n", "new/b.py": "print('b')\n", "empty/__init__.py": ""}
    assert file_diff("same", "x", "x") == ""


def test_split_patch_reads_quoted_and_spaced_paths() -> None:
    diff = (
        'diff --git "a/t\\303\\251st.py" "b/t\\303\\251st.py"\nnew file mode 100644\nindex 0..1\n'
        '--- /dev/null\n+++ "b/t\\303\\251st.py"\n@@ -0,0 +1 @@\n+x\n'
        "diff --git a/my dir/f.bin b/my dir/f.bin\nindex 1..2 100644\nGIT binary patch\nliteral 1\nIcmZp0\n\n"
    )
    assert [(p.path, p.kind) for p in split_patch(diff)] == [("tést.py", "new"), ("my dir/f.bin", "modified")]


# -- guards -----------------------------------------------------------------------------------------------------

TEST_PATCH = file_diff("tests/test_mini.py", None, "def test_add():\n    assert True\n")


@pytest.mark.parametrize(
    ("path", "old", "new", "reason"),
    [
        ("tests/test_mini.py", None, "def test_add(): pass\n", "hidden test file"),
        ("tests/test_other.py", "x\n", None, "protected (tests)"),
        ("test_mini.py", None, "x\n", "protected (test_*.py)"),
        ("tests/test_mini.py/x.py", None, "x\n", "hidden test file"),
        ("conftest.py", None, "x\n", "protected (conftest.py)"),
        ("pkg/conftest.py", "a\n", "b\n", "protected (conftest.py)"),
        ("pyproject.toml", "a\n", "b\n", "protected (pyproject.toml)"),
        ("setup.cfg", None, "[tool:pytest]\n", "protected (setup.cfg)"),
        ("src/sitecustomize.py", None, "x\n", "protected (sitecustomize.py)"),
        ("hack.pth", None, "import x\n", "protected (*.pth)"),
        ("fake.dist-info/entry_points.txt", None, "[pytest11]\n", "protected (*.dist-info)"),
        ("pkg/__pycache__/m.cpython-311.pyc", None, "x\n", "protected (__pycache__)"),
        ("pytest.py", None, "x\n", "shadows module 'pytest'"),
        ("src/_pytest/__init__.py", None, "x\n", "shadows module '_pytest'"),
        ("json/__init__.py", None, "x\n", "shadows module 'json'"),
    ],
)
def test_guards_drop_protected_changes(path: str, old: str | None, new: str | None, reason: str) -> None:
    legit = file_diff("pkg/mini.py", "a - b\n", "a + b\n")
    kept, dropped = filter_patch(legit + file_diff(path, old, new), TEST_PATCH)
    assert kept == legit
    assert dropped == {path: reason}


def test_guards_keep_ordinary_changes() -> None:
    diff = file_diff("pkg/json.py", None, "x\n") + file_diff("pkg/testing_utils.py", "a\n", "b\n")
    assert filter_patch(diff, TEST_PATCH) == (diff, {})


def test_runner_hooks_are_flagged() -> None:
    hooks = [
        "import pytest", "import os, _pytest.runner", "from _pytest import runner", "__import__('pluggy')",
        "importlib.import_module('pytest')", "sys.modules['pytest']",
    ]  # fmt: skip
    diff = file_diff("pkg/m.py", "", "".join(h + "\n" for h in hooks))
    assert runner_hooks(diff) == hooks[:5]
    assert runner_hooks(file_diff("pkg/m.py", "", "# run the tests with pytest\nx = 'pytest'\n")) == []


# -- pytest summaries -------------------------------------------------------------------------------------------

SUMMARY = """\
=================================== FAILURES ===================================
__________________________________ test_sub ___________________________________
t.py:5: in test_sub
    assert sub(3, 1) == 2
E   assert 4 == 2
________________________________ TestK.test_k[a - b] ________________________________
E   boom
=========================== short test summary info ============================
PASSED t.py::test_add
PASSED t.py::test_teardown
ERROR t.py::test_teardown - RuntimeError: teardown
FAILED t.py::test_sub - assert 4 == 2
FAILED t.py::TestK::test_k[a - b] - AssertionError: x - y
XFAIL t.py::test_x - known
SKIPPED [1] t.py:9: no
ERROR broken.py - ImportError: nope
========================= 2 failed, 1 passed in 0.1s ===========================
"""


def test_parse_summary() -> None:
    results = parse_summary(SUMMARY)
    assert results["t.py::test_add"] == "PASSED"
    assert results["t.py::test_teardown"] == "ERROR"  # an error after passing wins
    assert results["t.py::test_sub"] == "FAILED"
    assert outcome(results, "t.py::TestK::test_k[a - b]") == "FAILED"
    assert outcome(results, "t.py::test_x") == "XFAIL"
    assert outcome(results, "t.py::test_never") == "MISSING"
    assert outcome(results, "broken.py::test_y") == "ERROR"
    sections = failure_sections(SUMMARY)
    assert list(sections) == ["test_sub", "TestK.test_k[a - b]"]
    assert "assert 4 == 2" in sections["test_sub"]


# -- mutations --------------------------------------------------------------------------------------------------

MODULE = '''\
"""Doc."""
LIMIT = 10  # module level: never mutated


def clamp(x, lo, hi):
    if x < lo or x is None:
        return lo
    total = 0
    for i in range(3):
        total += i * 2
        if not i:
            continue
    log.append(x)  # a statement that can go
    return min(x, hi) + total - 1


class K:
    def flag(self):
        return True
'''


def test_mutations_are_minimal_valid_edits() -> None:
    muts = find_mutations("m.py", MODULE)
    kinds = {m.kind for m in muts}
    assert kinds == {"operator", "compare", "boolop", "constant", "negate", "return", "remove"}
    assert all(m.line > 4 for m in muts)  # nothing at module level
    assert {m.function for m in muts} == {"clamp", "K.flag"}
    for m in muts:
        mutant = apply_mutation(MODULE, m)
        ast.parse(mutant)
        changed = [(a, b) for a, b in zip(MODULE.splitlines(), mutant.splitlines(), strict=True) if a != b]
        assert len(changed) == 1, m.describe()
    by = {(m.kind, m.original): m.replacement for m in muts}
    assert by[("compare", "<")] == "<="
    assert by[("compare", "is")] == "is not"
    assert by[("boolop", "or")] == "and"
    assert by[("operator", "+=")] == "-="
    assert by[("negate", "not i")] == "i"
    assert by[("remove", "log.append(x)")] == "pass"
    assert by[("constant", "True")] == "False"
    assert find_mutations("bad.py", "def (:\n") == []


# -- sdists -----------------------------------------------------------------------------------------------------


def make_sdist(path: Path, files: dict[str, str], top: str = "mini-1.0") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            data = text.encode()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_read_sdist_tells_code_from_tests(tmp_path: Path) -> None:
    sdist = make_sdist(
        tmp_path / "mini-1.0.tar.gz",
        {
            "src/mini/__init__.py": "def f():\n    return 1\n", "src/mini/util.py": "x = 1\n",
            "tests/test_mini.py": "def test_f(): pass\n", "tests/helpers.py": "", "setup.py": "",
            "docs/conf.py": "", "PKG-INFO": "", "mini.egg-info/PKG-INFO": "", "scripts/tool.py": "",
        },
    )  # fmt: skip
    tree = read_sdist(sdist)
    assert (tree.name, tree.version, tree.import_root) == ("mini", "1.0", "src")
    assert tree.source_modules == ["src/mini/__init__.py", "src/mini/util.py"]
    assert tree.test_modules == ["tests/test_mini.py"]
    assert tree.is_test("tests/helpers.py") and not tree.is_test("src/mini/util.py")
    assert "docs/conf.py" not in tree.files and "PKG-INFO" not in tree.files
    with pytest.raises(SdistError, match="carries no tests"):
        read_sdist(make_sdist(tmp_path / "bare-1.0.tar.gz", {"bare.py": "x = 1\n"}, "bare-1.0"))


# -- recipes ----------------------------------------------------------------------------------------------------


def test_swe_recipe_loads_with_resolved_task_file(tmp_path: Path) -> None:
    assert "swe" in list_recipes()
    recipe = load_recipe("swe")
    assert recipe["name"] == "swe"
    assert Path(recipe["tasks"]) == ROOT / "recipes/swe/tasks.jsonl"
    assert recipe["verifier"]["name"] == "tests"
    (tmp_path / "mine.yaml").write_text("tasks: my.jsonl\nsandbox: local\n")
    mine = load_recipe(tmp_path / "mine.yaml")
    assert mine["tasks"] == str(tmp_path / "my.jsonl") and mine["name"] == "mine"
    with pytest.raises(RecipeError, match=r"no recipe 'nope'.*swe"):
        load_recipe("nope")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(RecipeError, match="must be a YAML mapping"):
        load_recipe(tmp_path / "list.yaml")


def test_committed_task_set_is_small_and_well_formed() -> None:
    path = ROOT / "recipes/swe/tasks.jsonl"
    assert path.stat().st_size < 5_000_000
    tasks = load_tasks(path)
    assert len(tasks) >= 30
    assert len({t.repo for t in tasks}) >= 3
    for task in tasks:
        assert task.FAIL_TO_PASS and task.patch and task.test_patch and task.repo_snapshot
        hidden = set(patch_paths(task.test_patch))
        assert not hidden & set(snapshot_files(task.repo_snapshot)), "hidden tests leak into the snapshot"
        assert {t.split("::")[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS} <= hidden
