"""What an episode leaves behind never reaches the next episode of its group (`rollout.reuse: group`): a process
started with a cleared environment is killed by the reset; a file written where the reset restores nothing (outside
the workdir and /tmp in a container, beside the workdir in a local sandbox's folder) is removed, or seen by the
check, and then the next episode gets a fresh sandbox."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from hrl.sandboxes import SandboxSpec
from hrl.sandboxes.local import LocalBackend, bwrap_works
from hrl.sandboxes.pool import SandboxPool
from tests.runners.tasks.test_verifier import mini_task, verifier

RUNNING = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"


def test_a_local_reset_removes_what_an_episode_left_beside_the_workdir(tmp_path: Path) -> None:
    """Under bubblewrap the sandbox's own folder is writable, the workdir's parent included: a file left there is
    removed by the reset, so the next episode, which can read it there, finds nothing."""
    assert bwrap_works(), "bubblewrap is needed (.ci/setup.sh installs it)"

    async def main() -> None:
        pool = SandboxPool(LocalBackend(root=str(tmp_path), isolate=True), f"test-{uuid.uuid4().hex[:8]}",
                           reuse="group")  # fmt: skip
        spec = SandboxSpec(workdir="/work", network="none")
        async with pool.lease(spec, "g-0", prepare=_nothing, group="g") as one:
            assert (await one.sandbox.exec("echo left > ../left.txt && mkdir ../left.d")).exit_code == 0
        async with pool.lease(spec, "g-1", prepare=_nothing, group="g") as two:
            assert two.source == "reused" and two.sandbox is one.sandbox
            seen = await two.sandbox.exec("ls -A ..")
            assert "left" not in seen.stdout, seen.stdout
        await pool.close()

    asyncio.run(main())


async def _nothing(sandbox: Any) -> None:
    return None


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_docker_reuse_kills_every_process_and_never_hands_on_a_file_written_outside(swe_image: str) -> None:
    """A container's reset kills by pid, not by environment: a process started with `env -i` (no mark of hrl's) is
    gone for the next episode, which gets the same container. A file written outside the workdir and /tmp (the
    reset restores neither /opt nor /dev/shm), or a process that wrote itself into the reset's own list of what to
    keep, is seen by the check: the next episode gets a fresh container, counted, and finds neither."""
    import docker

    from hrl.sandboxes.docker import DockerBackend

    task, grader = mini_task("docker"), verifier("docker")
    spec = grader.sandbox_spec(task)
    rid = f"test-{uuid.uuid4().hex[:8]}"
    leave = {
        "process": "setsid env -i /bin/sleep 501 >/dev/null 2>&1 < /dev/null &",
        "file": "echo MARK-left > /opt/left.txt",
        "shm": "echo MARK-left > /dev/shm/left",
        "kept": "sleep 502 >/dev/null 2>&1 & p=$!; "
        "echo \"$p:$(cut -d' ' -f22 /proc/$p/stat)\" >> /var/tmp/hrl-reset/keep",
    }

    async def prepare(sandbox: Any) -> None:
        await grader.prepare(sandbox, task)

    async def main() -> dict[str, tuple[Any, Any, str]]:
        pool = SandboxPool(DockerBackend(), rid, reuse="group")
        seen = {}
        try:  # a failing check must not leave containers behind
            for group, script in leave.items():
                async with pool.lease(spec, f"{group}-0", prepare=prepare, group=group) as one:
                    assert (await one.sandbox.exec(["sh", "-c", script])).exit_code == 0
                    assert group != "process" or "sleep 501" in (await one.sandbox.exec(RUNNING)).stdout
                async with pool.lease(spec, f"{group}-1", prepare=prepare, group=group) as two:
                    running = (await two.sandbox.exec(RUNNING)).stdout
                    files = (await two.sandbox.exec("cat /opt/left.txt /dev/shm/left")).stdout
                    seen[group] = (two, two.sandbox is one.sandbox, running + files)
            assert pool.counts["reset_mismatch"] == 3 and pool.counts["reused"] == 1
        finally:
            await pool.close()
        return seen

    seen = asyncio.run(main())
    two, same, out = seen["process"]
    assert two.source == "reused" and same and "sleep 501" not in out, out
    for group in ("file", "shm", "kept"):
        two, same, out = seen[group]
        assert two.source == "created" and not same and two.mismatches == 1, group
        assert "MARK-left" not in out and "sleep 502" not in out, (group, out)
    left = docker.from_env().containers.list(all=True, filters={"label": f"hrl.run={rid}"}, ignore_removed=True)
    assert left == []
