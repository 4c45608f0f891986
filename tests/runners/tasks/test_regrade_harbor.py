"""`hrl regrade` on Harbor episodes, in Docker: the agent's committed container is kept as the episode's final image,
graded again by the task's tests/test.sh; a recorded reward that does not follow from it is a disagreement, and an
episode whose image was removed is set apart, never a disagreement."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.tasks.harbor import load_harbor_tasks
from hrl.runners.tasks.harbor_verifier import FINAL_REPO, HarborVerifier
from hrl.runners.tasks.regrade import archive_episode
from hrl.runners.trace import write_trace
from hrl.sandboxes import get_backend
from tests.harbor_tasks import FIX, write_task
from tests.runners.tasks.test_regrade import trace

pytestmark = pytest.mark.docker


async def _episode(verifier: HarborVerifier, task, script: str):
    """An 'agent' that runs `script` in the task's container, then the verdict on the state it left."""
    await verifier.provision(task)
    async with await verifier.backend.create(verifier.sandbox_spec(task), "hrl-test", "regrade-agent") as sandbox:
        assert (await sandbox.exec(["bash", "-c", script])).exit_code == 0
        return await verifier.verify(sandbox, task)


def _regrade(source: Path) -> dict:
    cmd = [sys.executable, "-m", "hrl.cli", "regrade", str(source), "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("carry", ["container", "workdir"])
def test_harbor_episodes_regrade_from_their_kept_final_image(tmp_path: Path, carry: str):
    """container: the agent's committed container is kept; workdir: the clean image with the agent's workdir."""
    import docker

    task = load_harbor_tasks(write_task(tmp_path / "tasks", "reward-file"))[0]
    run_id = f"hrl-test-regrade-{carry}"  # its own: the kept images are pruned by run at the end
    verifier = HarborVerifier(get_backend("docker"), carry=carry, run_id=run_id)

    async def both():
        return await asyncio.gather(_episode(verifier, task, FIX), _episode(verifier, task, "true"))

    fixed, untouched = asyncio.run(both())
    assert (fixed.reward, untouched.reward) == (1.0, 0.0), (fixed.reward_info, untouched.reward_info)
    images = [v.reward_info["final_image"] for v in (fixed, untouched)]
    assert all(i.startswith(f"{FINAL_REPO}:") for i in images) and images[0] != images[1]
    client = docker.from_env()
    try:
        run = tmp_path / "run"
        run.mkdir()
        for verdict, altered in ((fixed, False), (untouched, False), (fixed, True)):
            name = "altered.jsonl" if altered else "traces.jsonl"
            meta = archive_episode(run / name, task, {"name": "harbor", "carry": carry}, {"patch": ""})
            record = trace(task.instance_id, verdict.reward, meta, env={"sandbox": "docker"})
            record["reward_info"] = dict(verdict.reward_info)
            if altered:
                record["reward"] = 0.0  # the fixed episode recorded as a failure: regrading must say so
            write_trace(run / name, record)
        same = _regrade(run / "traces.jsonl")
        assert (same["regraded"], same["agreement"], same["disagreements"]) == (2, 1.0, []), same
        altered = _regrade(run / "altered.jsonl")
        assert altered["agreement"] == 0.0 and [d["regraded"] for d in altered["disagreements"]] == [1.0], altered
        client.images.remove(images[0], force=True)  # the snapshot gone: set apart, not a disagreement
        gone = _regrade(run / "altered.jsonl")
        assert gone["disagreements"] == [] and "removed" in gone["not_regradable"][0]["why"], gone
        cmd = [sys.executable, "-m", "hrl.cli", "sandbox", "prune", "--run", run_id, "--final-images", "--json"]
        pruned = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert pruned.returncode == 0 and json.loads(pruned.stdout)["final_images"] == 1, pruned.stdout + pruned.stderr
        assert not client.images.list(filters={"label": f"hrl.run={run_id}"})  # the other kept image, by its run
    finally:
        for image in images:
            try:
                client.images.remove(image, force=True)
            except docker.errors.ImageNotFound:
                pass
