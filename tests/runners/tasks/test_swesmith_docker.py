"""A SWE-smith-format row graded in an image built here in SWE-smith's layout (the clean repository at /testbed,
its profile's conda environment): `hrl tasks validate` gives gold (the bug patch reversed) 1 and no patch 0, and the
agent's sandbox holds the bug without the FAIL_TO_PASS test files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hrl.runners.tasks import TestVerifier, TestVerifierConfig, load_tasks
from hrl.runners.tasks.swesmith import parse_log
from hrl.sandboxes import get_backend
from tests.runners.tasks.swebench_images import OAUTHLIB, ensure_images

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
LOGS = Path(__file__).parent / "fixtures" / "swesmith"


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("swesmith")
    path = scratch / "swesmith.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ensure_images(scratch, (OAUTHLIB,))))
    return path


def test_validate_gold_one_empty_zero(task_file: Path) -> None:
    from typer.testing import CliRunner

    from hrl.cli.main import app

    result = CliRunner().invoke(app, ["tasks", "validate", str(task_file), "--json"])
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.stdout)
    assert check["ok"], check
    assert check["gold"]["reward"] == 1.0 and check["empty"]["reward"] == 0.0
    assert check["empty"]["fail_to_pass"]["passed"] == 0 and check["empty"]["pass_to_pass"]["passed"] == 1


def test_the_agent_sees_the_bug_without_the_failing_tests(task_file: Path) -> None:
    (task,) = load_tasks(task_file)
    verifier = TestVerifier(get_backend("docker"), TestVerifierConfig())

    async def look() -> tuple[str, str]:
        async with await verifier.backend.create(verifier.sandbox_spec(task), "hrl-test", "smith-agent") as sandbox:
            await verifier.prepare(sandbox, task)
            code = await sandbox.exec(["cat", "oauthlib/__init__.py"])
            tests = await sandbox.exec(["bash", "-c", "ls tests; git log --oneline | wc -l"])
            return code.stdout, tests.stdout

    code, tests = asyncio.run(look())
    assert '"+"' in code  # the bug is in
    assert "test_common.py" not in tests and tests.split()[-1] == "1"  # F2P file gone, one fresh commit


def test_recorded_log_reads_as_a_fresh_run(task_file: Path) -> None:
    """fixtures/swesmith/oauthlib.log is the grading output of the bug state; the profile's parser reads the same
    outcomes from a fresh run."""
    (task,) = load_tasks(task_file)
    verdict = asyncio.run(TestVerifier(get_backend("docker"), TestVerifierConfig()).grade(task, ""))
    recorded = parse_log(task, (LOGS / "oauthlib.log").read_text())
    assert verdict.reward_info["tests"] == {t: recorded[t] for t in verdict.reward_info["tests"]}
