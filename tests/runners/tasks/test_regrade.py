"""The archive `hrl regrade` reads: a diff longer than the trace keeps inline is archived whole (and regrades to
what it earned, where the cut one would not apply); a task is stored once under its content hash; a Harbor
episode whose trace names no kept final image is set apart saying why."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from hrl.runners.tasks.patches import file_diff
from hrl.runners.tasks.regrade import PATCH_INLINE, archive_dir, archive_episode, collect, regrade
from hrl.runners.trace import SCHEMA, write_trace
from tests.runners.tasks.test_verifier import mini_task, verifier


def trace(task_id: str, reward: float | None, metadata: dict[str, Any], **fields: Any) -> dict[str, Any]:
    now = time.time()
    return {"schema": SCHEMA, "trace_id": uuid.uuid4().hex, "session": "", "status": "ok", "calls": [],
            "started_at": now, "ended_at": now, "task_id": task_id, "reward": reward, "reward_info": {},
            "env": {"sandbox": "local"}, "failure_reason": None, "metadata": metadata, **fields}  # fmt: skip


def test_a_long_diff_is_archived_whole_and_regrades_from_the_archive(tmp_path: Path):
    task = mini_task("local")
    filler = "".join(f"line {i}\n" for i in range(4000))  # ~40 000 characters: twice what the trace keeps
    patch = task.patch + file_diff("notes.txt", None, filler)
    assert len(patch) > 2 * PATCH_INLINE
    file = tmp_path / "traces.jsonl"
    meta = archive_episode(file, task, {"name": "tests", "hide_paths": ["/secret"]}, {"patch": patch})
    assert len(meta["patch"]) == PATCH_INLINE and "hide_paths" not in meta["archive"]["verifier"]
    assert (tmp_path / meta["archive"]["patch"]).read_text() == patch
    again = archive_episode(file, task, {"name": "tests"}, {"patch": "x"})
    assert again["archive"]["task"] == meta["archive"]["task"] and "patch" not in again["archive"]
    assert len(list((archive_dir(file) / "tasks").iterdir())) == 1  # one task, stored once

    write_trace(file, trace(task.instance_id, 1.0, meta))
    [ep] = collect(file)
    assert ep.patch == patch and ep.task == task
    result = asyncio.run(regrade([ep], hide_paths=[str(archive_dir(file))]))
    assert (result.agreement, ep.regraded) == (1.0, 1.0), ep.regraded_info
    cut = asyncio.run(verifier("local").grade(task, meta["patch"]))  # what the trace alone holds does not apply
    assert cut.reward == 0.0 and "patch_error" in cut.reward_info


def test_episodes_without_a_state_to_grade_are_set_apart(tmp_path: Path):
    file = tmp_path / "traces.jsonl"
    task = mini_task("local")
    harbor = archive_episode(file, task, {"name": "harbor"}, {"patch": ""})
    assert set(harbor["archive"]) == {"verifier", "task"}  # its final state is an image its reward_info names
    write_trace(file, trace("h", 1.0, harbor))
    write_trace(file, trace("v", None, {}, failure_reason="verifier_error", status="failed"))
    write_trace(file, trace("s", None, {}, failure_reason="sandbox_error", status="failed"))
    write_trace(file, trace("old", 0.0, {"patch": ""}))  # written before tasks were archived, not in a run dir
    apart = {ep.task_id: (ep.apart, ep.why) for ep in collect(file)}
    assert apart["h"][0] == "not_regradable" and "Harbor" in apart["h"][1]
    assert apart["v"] == ("grading_failed", "verifier_error")
    assert apart["s"] == ("not_graded", "sandbox_error")
    assert apart["old"][0] == "not_regradable" and "archives no task" in apart["old"][1]
