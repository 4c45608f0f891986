"""`env.version` of a task that is not an image's: the content hash of its repository snapshot, or of a Harbor
task's folder. The same files give the same version whatever their encoding; any changed byte gives another."""

from __future__ import annotations

import hashlib
import re

from hrl.runners.tasks.harbor import load_harbor_tasks, task_version
from hrl.runners.tasks.task import Task, pack_snapshot, snapshot_version
from tests.harbor_tasks import write_task

FILES = {"pkg/__init__.py": "def add(a, b):\n    return a - b\n", "README.md": "pkg\n"}
SHA256 = re.compile(r"sha256:[0-9a-f]{64}")


def _task(snapshot: object = None, **fields: object) -> Task:
    return Task(**{"instance_id": "t1", "problem_statement": "fix add", "FAIL_TO_PASS": ["t.py::t"], **fields},
                repo_snapshot=snapshot)  # fmt: skip


def test_a_snapshot_version_is_its_files_content_hash_in_either_encoding():
    as_text = snapshot_version(_task(FILES))
    as_tar = snapshot_version(_task(pack_snapshot({k: v.encode() for k, v in FILES.items()})))
    assert SHA256.fullmatch(as_text) and as_text == as_tar
    # the documented digest: sha256 over "path\0size\0bytes" of each file, sorted by path
    expected = hashlib.sha256(b"".join(f"{k}\0{len(v)}\0{v}".encode() for k, v in sorted(FILES.items())))
    assert as_text == f"sha256:{expected.hexdigest()}"
    changed = snapshot_version(_task({**FILES, "README.md": "pkg!\n"}))
    moved = snapshot_version(_task({"src/__init__.py": FILES["pkg/__init__.py"], "README.md": FILES["README.md"]}))
    assert len({as_text, changed, moved}) == 3
    assert snapshot_version(_task(FILES, problem_statement="other words")) == as_text  # the repository, not the task


def test_a_task_without_a_snapshot_is_versioned_by_its_record():
    a, b = snapshot_version(_task(base_commit="abc123")), snapshot_version(_task(base_commit="def456"))
    assert SHA256.fullmatch(a) and a != b


def test_a_harbor_task_version_follows_what_its_episodes_see(tmp_path):
    folder = write_task(tmp_path, "reward-file")
    (task,) = load_harbor_tasks(folder)
    first = task_version(task)
    assert SHA256.fullmatch(first)
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho another gold\n")
    assert task_version(task) == first  # no episode sees the solution
    (folder / "tests" / "test.sh").write_text((folder / "tests" / "test.sh").read_text() + "\n# changed\n")
    second = task_version(task)
    (folder / "environment" / "Dockerfile").write_text("FROM hrl/base:bookworm\nRUN true\n")
    assert len({first, second, task_version(task)}) == 3
