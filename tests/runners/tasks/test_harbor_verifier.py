"""The Harbor verifier for real, in Docker: images built from environment/, tests run in a fresh container after
the agent, the reward read from /logs/verifier, and what an agent could do to its own reward undone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hrl.runners.tasks.harbor import load_harbor_tasks
from hrl.runners.tasks.harbor_verifier import HarborVerifier
from hrl.sandboxes import get_backend
from tests.harbor_tasks import write_task

pytestmark = pytest.mark.docker


async def _agent_then_verify(verifier: HarborVerifier, task, script: str):
    """An 'agent' that runs `script` in the task's container, then the verdict on what it left."""
    await verifier.provision(task)
    async with await verifier.backend.create(verifier.sandbox_spec(task), "hrl-test", "harbor-agent") as sandbox:
        seen = await sandbox.exec(["bash", "-c", "ls /tests /solution 2>&1; pwd"])
        run = await sandbox.exec(["bash", "-c", script])
        assert run.exit_code == 0, run.stderr
        return seen.stdout, await verifier.verify(sandbox, task)


def test_the_agent_never_sees_the_tests_and_cannot_plant_a_reward(tmp_path: Path):
    task = load_harbor_tasks(write_task(tmp_path, "reward-file"))[0]
    verifier = HarborVerifier(get_backend("docker"), run_id="hrl-test", keep_final=False)
    plant = "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && printf 'exit 0' > /tests/test.sh"
    seen, verdict = asyncio.run(_agent_then_verify(verifier, task, plant))
    assert "No such file or directory" in seen and seen.strip().endswith("/app")  # the image's WORKDIR
    assert verdict.reward == 0.0 and verdict.failure_reason is None, verdict.reward_info


@pytest.mark.parametrize("carry", ["container", "workdir"])
def test_the_agents_changes_carry_over(tmp_path: Path, carry: str):
    """container: a change outside the workdir counts; workdir: only the workdir reaches the clean image."""
    verifier = HarborVerifier(get_backend("docker"), carry=carry, run_id="hrl-test", keep_final=False)
    fix = load_harbor_tasks(write_task(tmp_path, "reward-file"))[0]
    _, fixed = asyncio.run(_agent_then_verify(verifier, fix, "sed -i 's/a - b/a + b/' /app/calc.py"))
    assert fixed.reward == 1.0, fixed.reward_info
    outside = load_harbor_tasks(write_task(tmp_path, "reward-json"))[0]
    _, answered = asyncio.run(_agent_then_verify(verifier, outside, "mkdir -p /opt && echo 42 > /opt/answer.txt"))
    assert answered.reward == (1.0 if carry == "container" else 0.0), answered.reward_info
    assert answered.reward_info["rewards"] == {"reward": answered.reward, "style": 0.5}


def test_the_committed_image_is_removed_unless_kept(tmp_path: Path):
    import docker

    task = load_harbor_tasks(write_task(tmp_path, "reward-file"))[0]
    verifier = HarborVerifier(get_backend("docker"), run_id="hrl-test", keep_final=False)
    client = docker.from_env()
    before = {i.id for i in client.images.list(filters={"label": "hrl.task=reward-file", "dangling": True})}
    asyncio.run(_agent_then_verify(verifier, task, "true"))
    after = {i.id for i in client.images.list(filters={"label": "hrl.task=reward-file", "dangling": True})}
    assert after <= before


def test_a_test_sh_that_says_nothing_is_a_verifier_error(tmp_path: Path):
    folder = write_task(tmp_path, "reward-file")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho all good\n")
    task = load_harbor_tasks(folder)[0]
    verdict = asyncio.run(HarborVerifier(get_backend("docker"), run_id="hrl-test").grade(task, ""))
    assert verdict.failure_reason == "verifier_error" and verdict.reward is None
    assert "wrote no /logs/verifier/reward.txt" in verdict.reward_info["error"]


def test_a_harbor_task_needs_docker():
    from hrl.runners.errors import UsageError

    with pytest.raises(UsageError, match="Docker sandboxes"):
        HarborVerifier(get_backend("local"))
