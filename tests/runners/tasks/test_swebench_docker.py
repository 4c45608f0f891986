"""SWE-bench-format rows of three repositories with different runners (pytest, Django's, SymPy's), graded in images
built here in the official layout: `hrl tasks validate` gives gold 1 and no patch 0; a test run past its limit is
0; a missing image that cannot be pulled fails the sandbox, naming the image.

Cold, the three images build in a few minutes (wheels downloaded, SymPy and Django installed); they are cached by a
hash of what goes in, so later runs start at the grading.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.tasks import TestVerifier, TestVerifierConfig, load_tasks
from hrl.sandboxes import SandboxSpec, SandboxUnavailableError, get_backend
from tests.runners.tasks.swebench_images import FIXTURES, ensure_images, run_eval

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]
LOGS = Path(__file__).parent / "fixtures" / "swebench"


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("swebench")
    rows = ensure_images(scratch)
    path = scratch / "swebench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_validate_gold_one_empty_zero(task_file: Path) -> None:
    from typer.testing import CliRunner

    from hrl.cli.main import app

    result = CliRunner().invoke(app, ["tasks", "validate", str(task_file), "--json", "--concurrency", "3"])
    assert result.exit_code == 0, result.output
    checks = {c["instance_id"]: c for c in json.loads(result.stdout)}
    assert sorted(checks) == sorted(f.instance_id for f in FIXTURES)
    for check in checks.values():
        assert check["ok"], check
        assert check["gold"]["reward"] == 1.0 and check["empty"]["reward"] == 0.0
        assert check["empty"]["fail_to_pass"]["passed"] == 0 and check["empty"]["pass_to_pass"]["passed"] == 1


def test_recorded_logs_match_a_fresh_run(task_file: Path) -> None:
    """The fixtures' logs are what the runners print now: the parser reads the same outcomes from both."""
    from hrl.runners.tasks.swebench import parse_log

    for task in load_tasks(task_file):
        fresh = parse_log(task, run_eval(task))
        recorded = parse_log(task, (LOGS / f"{task.repo.split('/')[1]}.log").read_text())
        listed = task.FAIL_TO_PASS + task.PASS_TO_PASS
        assert {t: fresh.get(t) for t in listed} == {t: recorded.get(t) for t in listed}, task.instance_id


def test_a_test_run_past_its_limit_scores_zero(task_file: Path) -> None:
    task = load_tasks(task_file)[0].model_copy(update={"test_timeout_s": 0.5})
    verdict = asyncio.run(TestVerifier(get_backend("docker"), TestVerifierConfig()).grade(task, task.patch))
    assert verdict.reward == 0.0 and verdict.failure_reason is None
    assert "ran past 0.5 s" in verdict.reward_info["timeout"]


def test_a_missing_image_that_cannot_be_pulled_names_the_image() -> None:
    image = "swebench/sweb.eval.x86_64.nobody_1776_nothing-1:latest"

    async def create() -> Any:
        backend = get_backend("docker")
        return await backend.create(SandboxSpec(image=image, pull=True, network="none"), "hrl-test", "missing")

    with pytest.raises(SandboxUnavailableError) as info:
        asyncio.run(create())
    assert image in str(info.value) and "cannot be pulled" in str(info.value)
    assert "image_registry" in (info.value.hint or "")
