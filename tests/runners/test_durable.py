"""Files replaced atomically: writers of the same path at once (two episodes of one task archiving the same content
under its hash) each replace it whole; none fails on another's temporary file, and none is left behind."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from hrl.runners.durable import write_atomically
from hrl.runners.tasks.regrade import archive_dir, archived
from hrl.runners.tasks.task import Task


def test_writers_of_one_path_at_once_each_replace_it_whole(tmp_path: Path):
    """Sixteen episodes of one task, archived at once on threads as rollouts do: every one names its archived task,
    none records an archive_error, and the folder holds the one task file and no temporary file."""
    trace_file = tmp_path / "traces.jsonl"
    task = Task(instance_id="t1", repo="r", base_commit="c", problem_statement="fix it " * 2000,
                FAIL_TO_PASS=["test_it"])  # fmt: skip

    async def sixteen() -> list[dict]:
        return await asyncio.gather(*(archived(trace_file, task, {"name": "tests"}, {"patch": "d"}) for _ in range(16)))

    for _ in range(5):
        extras = asyncio.run(sixteen())
        assert [e.get("archive_error") for e in extras] == [None] * 16
        assert len({e["archive"]["task"] for e in extras}) == 1
        (tmp_path / extras[0]["archive"]["task"]).unlink()  # the next round writes it again, all at once
    assert [p.name for p in (archive_dir(trace_file) / "tasks").iterdir()] == []


def test_a_replaced_file_has_the_mode_asked_and_a_failed_write_leaves_the_old_one(tmp_path: Path):
    path = tmp_path / "keys.json"
    write_atomically(path, "old", mode=0o600)
    assert (path.read_text(), stat.S_IMODE(path.stat().st_mode)) == ("old", 0o600)
    with pytest.raises(UnicodeEncodeError):
        write_atomically(path, "new \ud800")  # fails halfway: nothing of it is seen
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]  # its temporary file removed
