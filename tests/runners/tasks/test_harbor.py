"""Harbor task folders load as tasks: task.toml's timeouts and resources, instruction.md as the problem, the image
tag by content hash, and a malformed folder named in the error. No Docker needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrl.runners.tasks import load_tasks, task_summary, verifier_for
from hrl.runners.tasks.harbor import HarborTask, image_tag, load_harbor_tasks
from hrl.runners.tasks.task import TaskFormatError
from tests.harbor_tasks import write_dataset, write_task


def test_a_folder_of_task_folders_is_a_dataset(tmp_path: Path):
    tasks = load_tasks(write_dataset(tmp_path / "ds"))
    assert [t.instance_id for t in tasks] == ["failing-test", "reward-file", "reward-json", "slow-test"]
    assert all(isinstance(t, HarborTask) for t in tasks)
    by = {t.instance_id: t for t in tasks}
    assert by["reward-file"].agent_timeout_s == 120.0 and by["reward-file"].verifier_timeout_s == 60.0
    assert by["slow-test"].verifier_timeout_s == 3.0 and by["slow-test"].agent_timeout_s is None
    assert (by["reward-json"].cpus, by["reward-json"].memory_mb) == (1, 1024)  # memory = "1G"
    assert by["reward-file"].problem_statement.startswith("Task reward-file:")
    assert by["reward-file"].repo == "hrl-tests/reward-file"
    assert verifier_for(tmp_path / "ds") == "harbor" and verifier_for(tmp_path / "x.jsonl") == "tests"
    assert task_summary(by["reward-file"])["image"] == image_tag(by["reward-file"])  # what `hrl tasks ls` shows


def test_one_task_folder_is_a_dataset_of_one(tmp_path: Path):
    folder = write_task(tmp_path, "reward-file")
    assert [t.instance_id for t in load_harbor_tasks(folder)] == ["reward-file"]


def test_a_task_survives_a_round_trip_through_a_dict(tmp_path: Path):
    """The loops may hand a task on as a dict: its Harbor fields stay (the verifier reads them back)."""
    from hrl.runners.tasks import Task
    from hrl.runners.tasks.harbor_verifier import as_harbor

    task = load_harbor_tasks(write_task(tmp_path, "slow-test"))[0]
    again = as_harbor(Task.model_validate(task.model_dump()))
    assert again == task


def test_the_image_tag_follows_the_environment_contents(tmp_path: Path):
    folder = write_task(tmp_path, "reward-file")
    first = image_tag(load_harbor_tasks(folder)[0])
    assert first.startswith("hrl/harbor-reward-file:")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    assert image_tag(load_harbor_tasks(folder)[0]) == first  # tests are not part of the image
    (folder / "environment" / "extra.txt").write_text("x")
    assert image_tag(load_harbor_tasks(folder)[0]) != first


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda f: (f / "instruction.md").unlink(), "has no instruction.md"),
        (lambda f: (f / "tests" / "test.sh").unlink(), "has no tests/test.sh"),
        (lambda f: (f / "environment" / "Dockerfile").unlink(), "no environment/Dockerfile"),
        (lambda f: (f / "task.toml").write_text("[verifier\n"), "not TOML"),
        (lambda f: (f / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "is not a size"),
        (lambda f: (f / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n'), "verifier_timeout_s"),
    ],
)
def test_a_malformed_folder_is_named(tmp_path: Path, breakage, message):
    folder = write_task(tmp_path, "reward-file")
    breakage(folder)
    with pytest.raises(TaskFormatError, match=message) as caught:
        load_tasks(folder)
    assert "reward-file" in str(caught.value)


def test_a_folder_without_tasks_is_refused(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match="holds no Harbor task"):
        load_tasks(tmp_path / "empty")
