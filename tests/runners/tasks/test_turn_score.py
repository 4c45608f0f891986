"""The tests verifier's turn scores (`train.credit: turn`): the share of a task's tests passing with the agent's diff
so far, read mid-episode without changing what the agent sees, and the same measure as the final verdict's."""

from __future__ import annotations

import sys
from pathlib import Path

from hrl.runners.tasks import load_tasks
from hrl.runners.tasks.task import PYTEST
from tests.runners.tasks.test_verifier import backend_name, run, verifier

__all__ = ["backend_name"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[3]
# what the agent can see of its sandbox: the files, git's view of them, and every file under .git, hashed
FINGERPRINT = (
    "git status --porcelain --untracked-files=all; git diff; git diff --cached --stat; "
    "find . -type f -print0 | sort -z | xargs -0 sha256sum"
)


def _demo_task(backend: str):
    """The demo recipe's first task: `either` is written with `and`; its two FAIL_TO_PASS tests fail, its two
    PASS_TO_PASS tests pass."""
    task = load_tasks(ROOT / "recipes/demo/tasks.jsonl")[0]
    if backend == "local":
        files = " ".join(sorted({t.split("::")[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS}))
        task = task.model_copy(update={"test_cmd": f"{PYTEST.replace('python', sys.executable, 1)} {files}"})
    return task


def test_turn_scores_follow_the_fix_and_leave_the_sandbox_as_it_was(backend_name):
    task, v = _demo_task(backend_name), verifier(backend_name)
    assert v.scores_turns and len(task.FAIL_TO_PASS) == 2 and len(task.PASS_TO_PASS) == 2

    async def episode():
        async with await v.backend.create(v.sandbox_spec(task), v.config.run_id, "agent") as sandbox:
            await v.prepare(sandbox, task)
            before = await v.turn_score(task, await v.turn_state(sandbox, task))
            # the agent's work in progress: a note staged, a scratch file left untracked, the bug not yet fixed
            await sandbox.exec(["bash", "-c", "echo note > NOTES.md && git add NOTES.md && echo x > scratch.txt"])
            seen = (await sandbox.exec(["bash", "-c", FINGERPRINT])).stdout
            unfixed = await v.turn_score(task, await v.turn_state(sandbox, task))
            assert (await sandbox.exec(["bash", "-c", FINGERPRINT])).stdout == seen  # scoring changed nothing
            module = task.demo["module"]
            fix = f"sed -i 's/p and q/p or q/' {module}.py"
            assert (await sandbox.exec(["bash", "-c", fix])).exit_code == 0
            fixed = await v.turn_score(task, await v.turn_state(sandbox, task))
            verdict = await v.verify(sandbox, task)
            return before, unfixed, fixed, seen, verdict

    before, unfixed, fixed, seen, verdict = run(episode())
    assert "A  NOTES.md" in seen and "?? scratch.txt" in seen
    assert before == unfixed == 0.5  # the two PASS_TO_PASS tests pass, the two FAIL_TO_PASS ones fail
    assert fixed == 1.0
    assert verdict.reward == 1.0 and v.end_score(verdict) == fixed  # the final verdict, the same measure


def test_a_failed_grading_scores_nothing_and_a_diff_that_cannot_apply_scores_zero(backend_name):
    task, v = _demo_task(backend_name), verifier(backend_name)
    broken = "diff --git a/nothere.py b/nothere.py\n--- a/nothere.py\n+++ b/nothere.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert run(v.turn_score(task, broken)) == 0.0  # the agent's work fails before any test: what verify scores 0
    no_tests = task.model_copy(update={"test_cmd": "true"})  # prints no pytest summary: a grading failure
    assert run(v.turn_score(no_tests, "")) is None
