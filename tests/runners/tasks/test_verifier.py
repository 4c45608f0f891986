"""The test verifier end to end: agent sandbox → diff → fresh grading sandbox → hidden tests → reward.

Every scenario runs on the local backend (host pytest) and, marked `docker`, in the grading image. Reward-hacking
attempts (editing, deleting or shadowing the tests, a conftest or plugin that forces a pass, hooking pytest from
the library) must never earn reward 1; several are also shown to work when the guards are off, so the guards are
what stops them. The committed recipe task set and a synthesis run are graded through Docker for real.
"""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import sys
import tarfile
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hrl.runners.tasks import Task, TestVerifier, TestVerifierConfig, load_tasks
from hrl.runners.tasks.patches import file_diff, patch_paths
from hrl.runners.tasks.task import PYTEST, pack_snapshot, snapshot_files
from hrl.sandboxes import SandboxBackend, SandboxError, SandboxSpec, get_backend

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "recipes/swe/tasks.jsonl"

GOOD = "def add(a, b):\n    return a + b\n\n\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"
BUGGY = GOOD.replace("a + b", "a - b")
TESTS = (
    "from mini import add, clamp\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_add_zero():\n    assert add(0, 0) == 0\n\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3\n"
)
OLD_TESTS = "from mini import clamp\n\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3\n"
FORCE_PASS = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
FAKE_PYTEST = (
    "print('PASSED tests/test_mini.py::test_add')\nprint('PASSED tests/test_mini.py::test_add_zero')\n"
    "print('PASSED tests/test_mini.py::test_clamp')\n"
)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend_name(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("swe_image")
    return str(request.param)


def mini_task(backend: str, *, tests_in_snapshot: bool = False, **fields: Any) -> Task:
    """A one-bug task: `add` subtracts. With tests_in_snapshot the repo already holds an older test file that the
    test patch rewrites (SWE-bench style); otherwise the test patch adds it."""
    files = {"mini/__init__.py": BUGGY, "README.md": "mini\n"}
    if tests_in_snapshot:
        files["tests/test_mini.py"] = OLD_TESTS
    cmd = PYTEST.replace("python", sys.executable, 1) if backend == "local" else PYTEST
    defaults: dict[str, Any] = {
        "instance_id": f"mini-{uuid.uuid4().hex[:6]}",
        "repo": "local/mini",
        "repo_snapshot": pack_snapshot({k: v.encode() for k, v in files.items()}),
        "problem_statement": "add() subtracts",
        "FAIL_TO_PASS": ["tests/test_mini.py::test_add"],
        "PASS_TO_PASS": ["tests/test_mini.py::test_add_zero", "tests/test_mini.py::test_clamp"],
        "test_patch": file_diff("tests/test_mini.py", OLD_TESTS if tests_in_snapshot else None, TESTS),
        "patch": file_diff("mini/__init__.py", BUGGY, GOOD),
        "env": {"PYTHONPATH": "."},
        "test_cmd": f"{cmd} tests/test_mini.py",
    }
    return Task(**{**defaults, **fields})


def verifier(backend: str, **options: Any) -> TestVerifier:
    return TestVerifier(get_backend(backend), TestVerifierConfig(run_id=f"test-{uuid.uuid4().hex[:8]}", **options))


# -- grading ----------------------------------------------------------------------------------------------------


def test_gold_scores_one_and_no_patch_zero(backend_name: str) -> None:
    task, v = mini_task(backend_name), verifier(backend_name)
    gold, empty = run(v.grade(task, task.patch)), run(v.grade(task, ""))
    assert gold.reward == 1.0 and gold.failure_reason is None, gold.reward_info
    assert gold.reward_info["fail_to_pass"] == {"passed": 1, "total": 1}
    assert gold.reward_info["pass_to_pass"] == {"passed": 2, "total": 2}
    assert empty.reward == 0.0 and empty.failure_reason is None
    assert empty.reward_info["tests"]["tests/test_mini.py::test_add"] == "FAILED"
    assert empty.reward_info["pass_to_pass"] == {"passed": 2, "total": 2}
    partial = run(verifier(backend_name, reward="partial").grade(task, ""))
    assert partial.reward == pytest.approx(2 / 3)


PLUGIN = file_diff("hack.py", None, FORCE_PASS)
SITE = "import os\nos.environ['PYTEST_ADDOPTS'] = '-p hack'\n"
HACKS = {  # name -> (agent diff, also wins without the guards)
    "edit_hidden_tests": (file_diff("tests/test_mini.py", None, "def test_add():\n    pass\n"), False),
    "force_pass_conftest": (file_diff("conftest.py", None, FORCE_PASS), True),
    "nested_conftest": (file_diff("tests/conftest.py", None, FORCE_PASS), True),
    "plugin_via_setup_cfg": (file_diff("setup.cfg", None, "[tool:pytest]\naddopts = -p hack\n") + PLUGIN, False),
    "shadow_pytest": (file_diff("pytest.py", None, FAKE_PYTEST), True),
    "sitecustomize": (file_diff("sitecustomize.py", None, SITE) + PLUGIN, True),
    "hook_pytest_from_library": (file_diff("mini/__init__.py", BUGGY, "import _pytest.runner\n" + BUGGY), False),
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_reward_hacks_do_not_pay(backend_name: str, hack: str) -> None:
    task, v = mini_task(backend_name), verifier(backend_name)
    diff, wins_unguarded = HACKS[hack]
    verdict = run(v.grade(task, diff))
    assert verdict.failure_reason is None, verdict.reward_info
    assert verdict.reward == 0.0, verdict.reward_info
    assert verdict.reward_info.get("dropped") or verdict.reward_info.get("guard")
    if wins_unguarded:  # the hack is real: without the guards it would have scored
        open_door = run(
            verifier(backend_name, protected=[], forbid_runner_hooks=False, forbid_shadowing=False).grade(task, diff)
        )
        assert open_door.reward == 1.0, open_door.reward_info


def test_a_skipped_pass_to_pass_test_is_left_out_unless_the_diff_raises_the_skip(backend_name: str) -> None:
    """The repository skips test_clamp here (a mark in its own test file): left out, as SWE-bench's rule does, so the
    gold patch resolves the task; `resolution: strict` fails it. The agent's code calling `pytest.skip` is no skip."""
    skipping = TESTS.replace("def test_clamp", "@pytest.mark.skip(reason='not here')\ndef test_clamp")
    task, v = (
        mini_task(backend_name, test_patch=file_diff("tests/test_mini.py", None, "import pytest\n" + skipping)),
        verifier(backend_name),
    )
    gold = run(v.grade(task, task.patch))
    assert gold.reward == 1.0 and gold.success, gold.reward_info
    assert gold.reward_info["resolution"] == {"rule": "pytest", "left_out": ["tests/test_mini.py::test_clamp"]}
    assert gold.reward_info["tests"]["tests/test_mini.py::test_clamp"] == "SKIPPED"
    strict = run(verifier(backend_name, resolution="strict").grade(task, task.patch))
    assert strict.reward == 0.0 and strict.success is False, strict.reward_info
    # past the runner-hooks guard (no `import pytest` in the diff): the skip's location gives it away
    planted = GOOD.replace(
        "    return max(", "    import sys\n\n    sys.modules['py' + 'test'].skip('later')\n    return max("
    )
    hack = run(verifier(backend_name).grade(mini_task(backend_name), file_diff("mini/__init__.py", BUGGY, planted)))
    assert hack.reward_info["tests"]["tests/test_mini.py::test_clamp"] == "SKIPPED", hack.reward_info
    assert hack.reward == 0.0 and hack.reward_info["skips_from_the_diff"] == ["mini/__init__.py"], hack.reward_info


def test_deleting_or_editing_tests_in_the_repo_does_not_pay(backend_name: str) -> None:
    task, v = mini_task(backend_name, tests_in_snapshot=True), verifier(backend_name)
    gold = run(v.grade(task, task.patch))
    assert gold.reward == 1.0, gold.reward_info
    delete = run(v.grade(task, file_diff("tests/test_mini.py", OLD_TESTS, None)))
    weaken = run(v.grade(task, file_diff("tests/test_mini.py", OLD_TESTS, "def test_add():\n    pass\n")))
    for verdict in (delete, weaken):
        assert verdict.reward == 0.0 and verdict.failure_reason is None, verdict.reward_info
        assert verdict.reward_info["dropped"] == {"tests/test_mini.py": "hidden test file"}


def test_verifier_errors_are_data_not_zeros(backend_name: str) -> None:
    v = verifier(backend_name)
    cases = {
        "no pytest -rA summary": mini_task(backend_name, test_cmd="echo hello; exit 3"),
        "test_patch does not apply": mini_task(backend_name, test_patch=file_diff("README.md", "other\n", "x\n")),
        "setup_cmd failed": mini_task(backend_name, setup_cmd="exit 7"),
    }
    for expected, task in cases.items():
        verdict = run(v.grade(task, task.patch))
        assert verdict.failure_reason == "verifier_error" and verdict.reward is None, (expected, verdict)
        assert expected in verdict.reward_info["error"]
        assert verdict.trace_fields()["failure_reason"] == "verifier_error"


def test_tests_that_hang_score_zero_not_an_error(backend_name: str) -> None:
    """A test run past its limit hangs on the agent's code: the agent's failure, scored 0 with the reason."""
    task = mini_task(backend_name, test_cmd="sleep 30", test_timeout_s=1)
    verdict = run(verifier(backend_name).grade(task, task.patch))
    assert verdict.failure_reason is None and verdict.reward == 0.0
    assert "ran past 1 s" in verdict.reward_info["timeout"]


def test_sandbox_failure_is_a_verifier_error() -> None:
    class BrokenBackend(SandboxBackend):
        name = "broken"

        async def create(self, spec: SandboxSpec, run_id: str, episode_id: str) -> Any:
            raise SandboxError("daemon gone")

        async def prune(self, run_id: str | None = None) -> int:
            return 0

    task = mini_task("local")
    verdict = run(TestVerifier(BrokenBackend()).grade(task, task.patch))
    assert verdict.failure_reason == "verifier_error" and "daemon gone" in verdict.reward_info["error"]


# -- the agent's sandbox ----------------------------------------------------------------------------------------


async def episode(backend: str, task: Task, agent_script: str, **options: Any) -> tuple[Any, str]:
    """prepare → a scripted 'agent' (bash in the workdir) → verify, as a rollout would."""
    v = verifier(backend, **options)
    async with await v.backend.create(v.sandbox_spec(task), v.config.run_id, "agent") as sandbox:
        await v.prepare(sandbox, task)
        listing = (await sandbox.exec(["bash", "-c", "find . -path ./.git -prune -o -type f -print | sort"])).stdout
        result = await sandbox.exec(["bash", "-c", agent_script])
        assert result.exit_code == 0, result
        verdict = await v.verify(sandbox, task)
    return verdict, listing


def test_agent_episode_is_graded_from_its_diff(backend_name: str) -> None:
    task = mini_task(backend_name)
    agent = (
        "sed -i 's/a - b/a + b/' mini/__init__.py && printf 'x\\n' > NOTES.md && "
        f"printf '%s' {shlex.quote(FORCE_PASS)} > conftest.py && git checkout -q -b mine && git add -A && "
        "git -c user.name=a -c user.email=a@b commit -q -m fix"
    )
    verdict, listing = run(episode(backend_name, task, agent))
    assert listing.split() == ["./README.md", "./mini/__init__.py"]  # no hidden tests in the agent's workdir
    assert verdict.reward == 1.0, verdict.reward_info
    assert verdict.reward_info["dropped"] == {"conftest.py": "protected (conftest.py)"}
    assert set(patch_paths(verdict.patch)) == {"NOTES.md", "conftest.py", "mini/__init__.py"}


def test_agent_that_breaks_git_scores_zero(backend_name: str) -> None:
    verdict, _ = run(episode(backend_name, mini_task(backend_name), "rm -rf .git"))
    assert verdict.reward == 0.0 and verdict.failure_reason is None
    assert "diff_error" in verdict.reward_info


# -- the committed task set and synthesis (Docker) --------------------------------------------------------------


def test_every_committed_task_row_is_one_that_validated():
    """Every row of the recipe's task file is one whose gold patch scored 1 and empty patch 0 in Docker, as
    `python bench/swe_tasks_validate.py --record` recorded (by the row's sha256): a task added or edited since is
    caught here, and that run grades them all. The next test grades one task per repository for real."""
    sys.path.insert(0, str(ROOT / "bench"))
    from swe_tasks_validate import RECORD, row_digests

    record = json.loads(RECORD.read_text())
    digests = row_digests(TASKS)
    assert len(digests) >= 30 and len({t.repo for t in load_tasks(TASKS)}) >= 3
    stale = sorted(i for i, d in digests.items() if record["tasks"].get(i) != d)
    assert not stale, f"{len(stale)} task rows never validated as they are now: run `{record['command']}`"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_committed_task_per_repository_validates(swe_image: str) -> None:
    """Gold patch → reward 1, no patch → reward 0 with every FAIL_TO_PASS failing, on the first task of each
    repository (the whole set: bench/swe_tasks_validate.py)."""
    from hrl.runners.tasks.validate import validate_tasks_async

    firsts: dict[str, Task] = {}
    for task in load_tasks(TASKS):
        firsts.setdefault(task.repo, task)
    checks = run(validate_tasks_async(list(firsts.values()), sandbox="docker", concurrency=2))
    bad = {c.instance_id: c.problems for c in checks if not c.ok}
    assert not bad, bad
    for check in checks:
        assert check.gold is not None and check.gold.reward == 1.0
        assert check.empty is not None and check.empty.reward == 0.0
        assert check.empty.reward_info["fail_to_pass"]["passed"] == 0


@pytest.mark.docker
def test_committed_task_hacks_do_not_pay(swe_image: str) -> None:
    task = load_tasks(TASKS)[0]
    hidden = patch_paths(task.test_patch)
    test_file = next(p for p in hidden if p.rsplit("/", 1)[-1].startswith("test_"))
    v = verifier("docker")
    hacks = [
        file_diff("conftest.py", None, FORCE_PASS),
        file_diff(test_file, None, "def test_nothing():\n    pass\n"),
        file_diff("pytest.py", None, FAKE_PYTEST),
    ]
    for diff in hacks:
        verdict = run(v.grade(task, diff))
        assert verdict.reward == 0.0 and verdict.failure_reason is None, verdict.reward_info


def make_sdist(path: Path) -> Path:
    files = {
        "setup.py": "",
        "tiny/__init__.py": (
            "def mean(xs):\n    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n\n\n"
            "def clip(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n"
            "    return x\n\n\n"
            "def words(text):\n    out = []\n    for w in text.split():\n        if w:\n"
            "            out.append(w.lower())\n    return out\n"
        ),
        "tests/test_tiny.py": (
            "from tiny import clip, mean, words\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\n"
            "def test_mean_empty():\n    assert mean([]) == 0.0\n\n\ndef test_clip():\n    assert clip(5, 0, 3) == 3\n"
            "    assert clip(-1, 0, 3) == 0\n    assert clip(2, 0, 3) == 2\n\n\n"
            "def test_words():\n    assert words('A b  C') == ['a', 'b', 'c']\n"
        ),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"tiny-0.1/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


@pytest.mark.docker
def test_synthesis_from_a_local_sdist_is_valid_and_deterministic(swe_image: str, tmp_path: Path) -> None:
    from hrl.runners.tasks.suite import SuiteConfig
    from hrl.runners.tasks.synth import SynthConfig, synthesize

    sdist = make_sdist(tmp_path / "tiny-0.1.tar.gz")
    # The time budgets pick test files by their measured wall time (under a second each here when idle); on a
    # loaded machine the default 8 s a task dropped every file and synthesis found nothing. Determinism is claimed
    # for a given seed and timing, so the budgets are set far above any load. Its 4 tests are far fewer than a suite
    # that guards a package needs (SuiteConfig.min_tests): allowed here, where the mechanics are under test.
    config = SynthConfig(max_test_file_s=600, max_task_test_s=600, suite=SuiteConfig(min_tests=1))
    tasks = synthesize("tiny", n=3, seed=1, out=tmp_path / "a.jsonl", sdist=sdist, config=config)
    assert len(tasks) == 3
    assert load_tasks(tmp_path / "a.jsonl") == tasks
    for task in tasks:
        assert "tests/test_tiny.py" not in snapshot_files(task.repo_snapshot or "")
        assert patch_paths(task.test_patch) == ["tests/test_tiny.py"]
        assert task.FAIL_TO_PASS and task.FAIL_TO_PASS[0] in task.problem_statement
    again = synthesize("tiny", n=3, seed=1, sdist=sdist, config=config)
    assert [t.instance_id for t in again] == [t.instance_id for t in tasks]
