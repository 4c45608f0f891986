"""An R2E-Gym row graded in an image built here in R2E-Gym's layout (/testbed with its .venv and run_tests.sh, the
tests at /r2e_tests): `hrl tasks validate` gives gold 1 and no patch 0, and the agent's sandbox holds neither the
test script nor the tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hrl.runners.tasks import TestVerifier, TestVerifierConfig, load_tasks
from hrl.runners.tasks.r2egym import parse_log
from hrl.sandboxes import get_backend
from tests.runners.tasks.swebench_images import ensure_r2e_image

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
LOG = Path(__file__).parent / "fixtures" / "r2egym" / "textkit.log"


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("r2egym")
    path = scratch / "r2e.jsonl"
    path.write_text(json.dumps(ensure_r2e_image(scratch)) + "\n")
    return path


def test_validate_gold_one_empty_zero(task_file: Path) -> None:
    from typer.testing import CliRunner

    from hrl.cli.main import app

    result = CliRunner().invoke(app, ["tasks", "validate", str(task_file), "--json"])
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.stdout)
    assert check["ok"], check
    assert check["gold"]["reward"] == 1.0 and check["empty"]["reward"] == 0.0
    assert check["empty"]["fail_to_pass"] == {"passed": 1, "total": 2}  # test_shout passes before the fix too


def test_the_agent_sees_neither_the_test_script_nor_the_tests(task_file: Path) -> None:
    (task,) = load_tasks(task_file)
    verifier = TestVerifier(get_backend("docker"), TestVerifierConfig())

    async def look() -> str:
        async with await verifier.backend.create(verifier.sandbox_spec(task), "hrl-test", "r2e-agent") as sandbox:
            await verifier.prepare(sandbox, task)
            run = await sandbox.exec(["bash", "-c", "ls -a /testbed /; git -C /testbed ls-files"])
            return run.stdout

    listing = asyncio.run(look())
    assert "textkit" in listing and "run_tests.sh" not in listing and "r2e_tests" not in listing


def test_recorded_log_reads_as_a_fresh_run(task_file: Path) -> None:
    (task,) = load_tasks(task_file)
    verdict = asyncio.run(TestVerifier(get_backend("docker"), TestVerifierConfig()).grade(task, ""))
    assert verdict.reward_info["tests"] == parse_log(task, LOG.read_text())
