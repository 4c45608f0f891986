"""Verifiers score a finished episode. `TestVerifier` runs the task's hidden tests on the agent's diff.

Lifecycle, per episode:

1. `prepare(sandbox, task)`: the agent's sandbox gets the task's base state as a git repository with a history of
   one commit (no hidden tests, no gold patch: neither is ever written there, and an image repository's own
   history, which may hold the fix in later commits, is replaced unless `keep_image_history`).
2. The agent works.
3. `verify(sandbox, task)`: take the agent's diff (`git diff` against the base), then `grade` it: a **fresh**
   grading sandbox at the base state; the diff minus its protected parts (see `guards`); the hidden
   `test_patch` applied after it; the task's test command; per-test outcomes from pytest's `-rA` summary. A task
   with `grader: swebench` (SWE-bench-family rows) runs the official package's eval script instead, which applies
   the test patch itself, and is read by the package's log parser for its repository (`swebench.py`).
   `grader: swesmith` (SWE-smith rows): the base state is the image with the row's bug applied, and the swesmith
   package's profile for the repository gives the test command and log parser (`swesmith.py`). `grader: r2egym`
   (R2E-Gym rows): the image's own run_tests.sh, scored 1 when its outcomes are exactly the row's
   `expected_output_json` (`r2egym.py`).

Between turns (`train.credit: turn`, `runners/rollouts/turns.py`): `turn_state` peeks at the agent's diff without
changing its sandbox (`peek_diff`), `turn_score` grades it as in 3. and returns the share of the listed tests passing;
`end_score` reads the same share from the final verdict.

Resolution, the task's own pass/fail rule (`Verdict.success`), by `TestVerifierConfig.resolution`:

- `official` (default): SWE-bench-family rows (`grader: swebench`, `swesmith`) are resolved by the official
  package's report functions (`swebench.resolve`): the repository's evaluation type (FAIL_ONLY for SWE-bench
  Multimodal's JavaScript repositories, else PASS_AND_FAIL), a SKIPPED test left out, RESOLVED_FULL = success.
  `grader: pytest` tasks (hrl's own, no official package) by the same rule for PASS_TO_PASS: a SKIPPED one is left
  out (a test the repository skips here, e.g. for a missing optional dependency). Every FAIL_TO_PASS test must pass
  (a fix makes its own tests pass), and a skip raised from a file the agent's diff changed (the code under test
  calling `pytest.skip`) is no skip: it fails (rule `pytest`).
- `strict`: hrl's rule: every FAIL_TO_PASS and PASS_TO_PASS test PASSED or XFAIL; SKIPPED or absent fails.

`grader: r2egym` tasks use R2E-Gym's rule (exactly the expected outcomes). `reward_info["resolution"]["rule"]`
names the rule that decided.

Reward: "binary" (default) = 1 when the task is resolved, else 0; "partial" = the fraction of the tests the rule
counted that succeeded (the official rule's left-out tests are not counted). `success` is the rule's verdict
whatever the reward: a shaped reward never changes it. An episode failure is data: a diff that does not apply, or
reaches into the test runner, scores 0 (success false) with the reason in `reward_info`. A failure of grading itself (sandbox error, the test
patch or setup failing, a test command that prints no pytest summary or runs past its limit) is a Verdict with
`failure_reason="verifier_error"` and `reward=None`, never a silent 0.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

import hrl.runners.tasks.r2egym as _r2egym
import hrl.runners.tasks.swebench as _swebench
import hrl.runners.tasks.swesmith as _swesmith
from hrl.runners.tasks.guards import DEFAULT_PROTECTED, filter_patch, runner_hooks
from hrl.runners.tasks.patches import patch_paths
from hrl.runners.tasks.results import PASSING, outcome, parse_summary, skip_locations
from hrl.runners.tasks.task import DEFAULT_IMAGE, Task
from hrl.runners.tasks.workspace import WorkspaceError, apply_patch, collect_diff, lay_out, peek_diff
from hrl.sandboxes import Sandbox, SandboxBackend, SandboxError, SandboxSpec

__all__ = [
    "PythonVerifierConfig", "TestVerifier", "TestVerifierConfig", "Verdict", "Verifier", "score_tests",
]  # fmt: skip


@dataclass
class Verdict:
    reward: float | None  # None exactly when failure_reason is set
    reward_info: dict[str, Any] = field(default_factory=dict)
    failure_reason: str | None = None  # "verifier_error": grading itself failed
    patch: str = ""  # the agent's work as collected: its diff (before guards); a page's inputs (miniwob, JSON)
    success: bool | None = None  # the task's own pass/fail rule, apart from the (maybe shaped) reward; None: unknown

    def trace_fields(self) -> dict[str, Any]:
        """The fields of an `hrl.trace/1` record this verdict fills."""
        return {
            "reward": self.reward, "reward_info": self.reward_info, "failure_reason": self.failure_reason,
            "success": None if self.failure_reason else self.success,
        }  # fmt: skip

    @classmethod
    def error(cls, message: str, **info: Any) -> Verdict:
        return cls(None, {"error": message, **info}, failure_reason="verifier_error")

    @classmethod
    def failed(cls, info: dict[str, Any]) -> Verdict:
        """The agent's work fails the task before any test decides (a diff that does not apply, a guard)."""
        return cls(0.0, info, success=False)


class Verifier(Protocol):
    """What every verifier is; the verifiers inherit it (the members with a value or a body are defaults)."""

    name: str
    # grading takes the agent's whole container, not its workdir alone: a sandbox reused within a group would carry
    # what one episode left outside the workdir into the next one's grade
    grades_container: bool = False

    async def provision(self, task: Task) -> None:
        """Make what the task's sandboxes start from (a Harbor task's image); before `sandbox_spec`. Raises
        SandboxError when it cannot be had."""
        ...

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        """Image, workdir and environment for the agent's sandbox."""
        ...

    async def prepare(self, sandbox: Sandbox, task: Task) -> None:
        """Lay out the task's base state in the agent's sandbox. Raises SandboxError (and WorkspaceError)."""
        ...

    async def verify(self, sandbox: Sandbox, task: Task) -> Verdict:
        """Score the agent's work in `sandbox`. Never raises for episode or grading failures."""
        ...

    async def grade(self, task: Task, patch: str) -> Verdict:
        """Score a diff against the task's base state in a fresh sandbox."""
        ...

    # scores an episode's state between its turns (`train.credit: turn`); checked once before a run starts
    scores_turns: bool = False

    async def turn_state(self, sandbox: Sandbox, task: Task) -> str | None:
        """What a turn's score depends on, read from the agent's sandbox while the agent waits for the model: quick,
        and changing nothing there. None where this verifier cannot score turns. Raises SandboxError."""
        return None

    async def turn_score(self, task: Task, state: str) -> float | None:
        """The score in [0, 1] of a `turn_state`, had away from the agent's sandbox; None: not had (never raises)."""
        return None

    def end_score(self, verdict: Verdict) -> float | None:
        """`turn_score`'s measure of the episode's end state, read from its final verdict; None: not had."""
        return None

    def needs_browser(self, task: Task) -> bool:
        """The task is a browser's: the agent's CLI is given a browser MCP server (unless it drives one itself)."""
        return False

    def episode_spec(self, task: Task) -> SandboxSpec:
        """One episode's sandbox, where the verifier makes something per episode for it (a browser's socket folder,
        which `verify` or `release` removes); `sandbox_spec` where it makes nothing."""
        return self.sandbox_spec(task)

    async def release(self, sandbox: Sandbox) -> None:
        """Stop what the verifier started for `sandbox`'s episode (a browser), verified or not; nothing to stop
        where it starts nothing."""
        return

    async def close(self) -> None:
        """Let go of what the verifier holds for the run (browsers an episode left, their socket folders)."""
        return


class PythonVerifierConfig(BaseModel):
    """`verifier: {name: python}`: a white-box agent's answer scored by a Python function, with no sandbox."""

    function: str = Field(
        "",
        description="score(task, answer) -> reward | (reward, info) | (reward, info, success), as MODULE:FUNCTION or "
        "FILE.py:FUNCTION. success (the task's own pass/fail, apart from a shaped reward) may also be info's "
        "'success'; said nowhere, it is reward == 1 for a reward of 0 or 1, else null.",
    )
    hide_paths: list[str] = Field(default_factory=list, description="Host paths no sandbox may see (set by hrl).")


class TestVerifierConfig(BaseModel):
    __test__ = False  # not a pytest class
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    image: str = Field(DEFAULT_IMAGE, description="Grading (and agent) image for tasks that name none.")
    hide_paths: list[str] = Field(
        default_factory=list,
        description="Host paths no agent or grading sandbox may see: the task files (hidden tests, gold patches) "
        "and the run's outputs. `hrl rollout` and `hrl train` fill it in; local sandboxes enforce it.",
    )
    timeout_s: float = Field(300.0, ge=0, description="Limit for a task's test command in seconds; 0 = none.")
    setup_timeout_s: float = Field(
        120.0, gt=0, description="Limit for each setup step (layout, patches, setup_cmd), s."
    )
    reward: Literal["binary", "partial"] = Field(
        "binary",
        description="binary: 1 iff the task is resolved. partial: the fraction of the tests the resolution rule "
        "counts that succeed (success stays the rule's pass/fail).",
    )
    resolution: Literal["official", "strict"] = Field(
        "official",
        description="How SWE-bench-family rows (grader swebench, swesmith) are resolved. official: the package's "
        "report functions (its evaluation type per repository, FAIL_ONLY for SWE-bench Multimodal's JavaScript "
        "ones; a SKIPPED test left out; grader pytest tasks: a SKIPPED PASS_TO_PASS test left out unless the skip "
        "comes from a file the diff changed). strict: every listed test PASSED or XFAIL (skipped or absent fails).",
    )
    protected: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED),
        description="Globs; an agent change to a path with a matching component is dropped (see guards).",
    )
    forbid_runner_hooks: bool = Field(True, description="Reward 0 when the diff imports pytest/pluggy outside tests.")
    forbid_shadowing: bool = Field(
        True, description="Drop new top-level modules that shadow the stdlib or the test runner (see guards)."
    )
    disable_plugin_autoload: bool = Field(True, description="PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 for the tests.")
    max_diff_bytes: int = Field(5_000_000, ge=1, description="A larger agent diff scores 0 without grading.")
    cpus: float = Field(0.0, ge=0, description="CPU limit of a grading sandbox; 0 = none.")
    memory_mb: int = Field(0, ge=0, description="Memory limit of a grading sandbox in MiB; 0 = none.")
    log_chars: int = Field(3000, ge=0, description="How much of the test output's tail goes into reward_info['log'].")
    run_id: str = Field("hrl-grade", description="Label of grading sandboxes (hrl.run), for `hrl sandbox prune`.")
    image_registry: str = Field(
        "",
        description="HOST:PORT of a registry the per-instance images of SWE-bench-family tasks are pulled from when "
        "missing (tagged with their own names); empty: their own registry (Docker Hub). Present images are used.",
    )
    keep_image_history: bool = Field(
        False,
        description="Give the agent the image repository's git history (which may hold the fix and the hidden "
        "tests in later commits, tags or unreachable objects); False: a fresh history of one base commit.",
    )


class TestVerifier(Verifier):
    """Grades a diff with the task's tests in a fresh sandbox of `backend`."""

    name = "tests"
    __test__ = False  # not a pytest class

    def __init__(self, backend: SandboxBackend, config: TestVerifierConfig | None = None, **options: Any) -> None:
        self.backend = backend
        self.config = config or TestVerifierConfig(**options)

    async def provision(self, task: Task) -> None:
        """Nothing to make: the grading image is built by `ensure_image` (or named by the task)."""

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        cfg = self.config
        return SandboxSpec(
            image=task.image or cfg.image, workdir=task.workdir, env=dict(task.env), network="none",
            cpus=cfg.cpus, memory_mb=cfg.memory_mb, labels={"hrl.task": task.instance_id[:60]},
            hidden_paths=list(cfg.hide_paths), pull=task.grader != "pytest", registry=cfg.image_registry,
        )  # fmt: skip

    async def prepare(self, sandbox: Sandbox, task: Task) -> None:
        cfg = self.config
        await lay_out(sandbox, task, cfg.setup_timeout_s, fresh_history=not cfg.keep_image_history, for_agent=True)

    async def verify(self, sandbox: Sandbox, task: Task) -> Verdict:
        try:
            patch = await collect_diff(sandbox, self.config.setup_timeout_s)
        except WorkspaceError as exc:  # the agent broke the repository's git state: its episode, its 0
            return Verdict.failed({**_empty_counts(task), "diff_error": str(exc)})
        except (SandboxError, OSError) as exc:
            return Verdict.error(f"cannot read the agent's diff: {exc}")
        verdict = await self.grade(task, patch)
        verdict.patch = patch
        return verdict

    async def grade(self, task: Task, patch: str) -> Verdict:
        cfg, started = self.config, time.monotonic()
        roots = _import_roots(task) if cfg.forbid_shadowing else ()
        kept, dropped = filter_patch(patch, task.test_patch, cfg.protected, roots)
        info: dict[str, Any] = {**_empty_counts(task), "dropped": dropped} if dropped else _empty_counts(task)
        if len(patch.encode("utf-8", "surrogateescape")) > cfg.max_diff_bytes:
            return Verdict.failed({**info, "patch_error": f"diff larger than {cfg.max_diff_bytes} bytes"})
        if cfg.forbid_runner_hooks and (hooks := runner_hooks(kept)):
            return Verdict.failed({**info, "guard": "the diff reaches into the test runner", "hooks": hooks})
        episode = f"grade-{task.instance_id[:40]}-{uuid.uuid4().hex[:8]}"
        try:
            async with await self.backend.create(self.sandbox_spec(task), cfg.run_id, episode) as sandbox:
                verdict = await self._grade_in(sandbox, task, kept, info)
        except (SandboxError, OSError) as exc:
            verdict = Verdict.error(f"grading sandbox failed: {exc}")
        except Exception as exc:  # a grading bug must not end the run either; it is a verifier_error too
            verdict = Verdict.error(f"grading failed: {type(exc).__name__}: {exc}")
        verdict.reward_info["grading_s"] = round(time.monotonic() - started, 3)
        return verdict

    async def _grade_in(self, sandbox: Sandbox, task: Task, patch: str, info: dict[str, Any]) -> Verdict:
        cfg = self.config
        try:
            await lay_out(sandbox, task, cfg.setup_timeout_s)
        except WorkspaceError as exc:
            return Verdict.error(f"cannot lay out the task's base state: {exc}")
        try:
            await apply_patch(sandbox, patch, "agent", cfg.setup_timeout_s)
        except WorkspaceError as exc:
            return Verdict.failed({**info, "patch_error": str(exc)})
        swebench = task.grader != "pytest"  # the test patch: in the eval script, or none at all
        try:
            if not swebench:
                await apply_patch(sandbox, task.test_patch, "test-patch", cfg.setup_timeout_s)
        except WorkspaceError as exc:
            return Verdict.error(f"the task's test_patch does not apply: {exc}")
        env = dict(task.env)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if cfg.disable_plugin_autoload and not swebench:  # SWE-bench repositories' tests rely on their plugins
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        if task.setup_cmd:
            setup = await sandbox.exec(["bash", "-c", task.setup_cmd], timeout_s=cfg.setup_timeout_s, env=env)
            if setup.exit_code != 0:
                return Verdict.error(f"setup_cmd failed (exit {setup.exit_code}): {_tail(setup.stdout + setup.stderr)}")
        limit = task.test_timeout_s if task.test_timeout_s is not None else cfg.timeout_s
        family = {"swebench": _swebench, "swesmith": _swesmith, "r2egym": _r2egym}.get(task.grader)
        command = family.command(task) if family else task.resolved_test_cmd()
        run = await sandbox.exec(["bash", "-c", command], timeout_s=limit, env=env)
        log = _tail(run.stdout + ("\n" + run.stderr if run.stderr.strip() else ""), cfg.log_chars)
        if run.timed_out:  # the tests hang on the agent's code: its failure, scored 0 (not a grading error)
            return Verdict.failed({**info, "timeout": f"the tests ran past {limit:g} s", "log": log})
        results = family.parse_log(task, run.stdout) if family else parse_summary(run.stdout)
        if not family and (planted := sorted(skip_locations(run.stdout) & set(patch_paths(patch)))):
            info = {**info, "skips_from_the_diff": planted}  # the agent's code skips tests: they count as failed
        if not results and not (task.grader == "swebench" and _swebench.lists_only_failures(task, run.stdout)):
            what = f"no test results {task.repo}'s log parser can read" if swebench else "no pytest -rA summary"
            return Verdict.error(f"the test command printed {what} (exit {run.exit_code})", log=log)
        return self._score(task, results, {**info, "exit_code": run.exit_code, "log": log})

    def _score(self, task: Task, results: dict[str, str], info: dict[str, Any]) -> Verdict:
        return score_tests(task, results, self.config, info)

    scores_turns = True

    async def turn_state(self, sandbox: Sandbox, task: Task) -> str | None:
        """The agent's diff so far (`peek_diff`: the agent's index and objects untouched)."""
        return await peek_diff(sandbox, self.config.setup_timeout_s)

    async def turn_score(self, task: Task, state: str) -> float | None:
        """The share of the task's listed tests passing with that diff, graded as `verify` grades the final one."""
        return self.end_score(await self.grade(task, state))

    def end_score(self, verdict: Verdict) -> float | None:
        """The share of the task's FAIL_TO_PASS and PASS_TO_PASS tests that passed (whatever `reward` says); 0 for
        work that failed before any test ran (a diff that does not apply, a guard); None when grading failed."""
        if verdict.failure_reason is not None:
            return None
        counts = [verdict.reward_info.get(k) or {} for k in ("fail_to_pass", "pass_to_pass")]
        total = sum(int(c.get("total", 0)) for c in counts)
        return sum(int(c.get("passed", 0)) for c in counts) / total if total else None


def score_tests(
    task: Task, results: dict[str, str], config: TestVerifierConfig, info: dict[str, Any] | None = None
) -> Verdict:
    """The verdict on one graded run: `results` ({test: status}, as the task's log parser read the test output)
    resolved by the task's rule (the module docstring), scored as `config.reward` asks."""
    info = dict(info or {})
    if task.grader == "r2egym":  # R2E-Gym's rule: exactly the expected outcomes, tests that should fail included
        exact, matching = _r2egym.score(task, results)
        partial = config.reward == "partial" and task.FAIL_TO_PASS
        info["fail_to_pass"] = {"passed": matching, "total": len(task.FAIL_TO_PASS)}
        info["pass_to_pass"] = {"passed": 0, "total": 0}
        info["tests"] = {t: results.get(t, "MISSING") for t in task.FAIL_TO_PASS}
        info["resolution"] = {"rule": "r2egym"}
        return Verdict(matching / len(task.FAIL_TO_PASS) if partial else exact, info, success=exact == 1.0)
    if task.grader in ("swebench", "swesmith") and config.resolution == "official":
        return _official(task, results, config, info)
    tests = {t: outcome(results, t) for t in task.FAIL_TO_PASS + task.PASS_TO_PASS}
    lenient = task.grader == "pytest" and config.resolution == "official" and "skips_from_the_diff" not in info
    left_out = [t for t in task.PASS_TO_PASS if tests[t] == "SKIPPED"] if lenient else []
    f2p = sum(tests[t] in PASSING for t in task.FAIL_TO_PASS)
    p2p = sum(tests[t] in PASSING for t in task.PASS_TO_PASS)
    total = len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS) - len(left_out)
    success = total > 0 and f2p + p2p == total
    info["fail_to_pass"] = {"passed": f2p, "total": len(task.FAIL_TO_PASS)}
    info["pass_to_pass"] = {"passed": p2p, "total": len(task.PASS_TO_PASS)}
    info["tests"] = tests
    rule = "pytest" if task.grader == "pytest" and config.resolution == "official" else "strict"
    info["resolution"] = {"rule": rule} | ({"left_out": left_out} if left_out else {})
    reward = ((f2p + p2p) / total if total else 0.0) if config.reward == "partial" else float(success)
    return Verdict(reward, info, success=success)


def _official(task: Task, results: dict[str, str], config: TestVerifierConfig, info: dict[str, Any]) -> Verdict:
    """The official package's resolution (`swebench.resolve`). Partial reward: the share of the tests its report
    counted (passed or failed, not left out) that passed; 1 when it counted none, as it then resolves the task."""
    res = _swebench.resolve(task, results)
    (f2p, f2p_n), (p2p, p2p_n) = res.counts("FAIL_TO_PASS"), res.counts("PASS_TO_PASS")
    info["fail_to_pass"] = {"passed": f2p, "total": len(task.FAIL_TO_PASS)}
    info["pass_to_pass"] = {"passed": p2p, "total": len(task.PASS_TO_PASS)}
    info["tests"] = {t: results.get(t, "MISSING") for t in task.FAIL_TO_PASS + task.PASS_TO_PASS}
    left_out = res.left_out(task.FAIL_TO_PASS + task.PASS_TO_PASS)
    info["resolution"] = {"rule": "official", "package": res.package, "eval_type": res.eval_type,
                          "status": res.status} | ({"left_out": left_out} if left_out else {})  # fmt: skip
    counted = f2p_n + p2p_n
    reward = ((f2p + p2p) / counted if counted else 1.0) if config.reward == "partial" else float(res.resolved)
    return Verdict(reward, info, success=res.resolved)


def _empty_counts(task: Task) -> dict[str, Any]:
    return {
        "fail_to_pass": {"passed": 0, "total": len(task.FAIL_TO_PASS)},
        "pass_to_pass": {"passed": 0, "total": len(task.PASS_TO_PASS)},
    }


def _import_roots(task: Task) -> tuple[str, ...]:
    """Where a new top-level module would be importable: the repo root, src/, and the task's PYTHONPATH."""
    roots = ["", "src"]
    for entry in task.env.get("PYTHONPATH", "").split(":"):
        if entry and entry.startswith(task.workdir.rstrip("/") + "/"):
            entry = posixpath.relpath(entry, task.workdir)
        if entry and not entry.startswith("/"):
            roots.append(posixpath.normpath(entry))
    return tuple(dict.fromkeys(roots))


def _tail(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else "…" + text[-n:]
