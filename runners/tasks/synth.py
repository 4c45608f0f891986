"""`hrl tasks synth`: real SWE-format tasks from a pure-Python package whose sdist carries its tests. No LLM.

1. Download the sdist (`pip download --no-deps --no-binary :all: NAME==V`) or take a local one; read it.
2. In one sandbox of the grading image: run each test file (baseline), keep the files that pass within
   `max_test_file_s`, then run them together once more and keep the tests that passed both times.
3. Enumerate AST mutations of the package's modules (`mutate`), ordered by the seed: kinds interleaved, at most one
   per function. For each: write the mutant, run the kept test files, restore. A mutant is kept when it breaks
   between 1 and `max_broken` tests, breaks no file's import, and does not time out.
4. Task: base state = the mutant without any test files; FAIL_TO_PASS = broken tests (at most
   `max_fail_to_pass`, from the fastest files); PASS_TO_PASS = other passing tests of those files (at most
   `max_pass_to_pass`); test_patch = those test files plus the test support files (conftest, helpers, data);
   gold patch = the mutation reversed; problem statement = the failing tests and the first failure's output;
   test_cmd = pytest on the listed tests only (grading stays fast whatever the size of the suite).
5. Validate each task through the real verifier (gold → 1, no patch → FAIL_TO_PASS fail) and keep the valid.

A suite too weak to guard the package (`suite.SuiteConfig`: too few tests kept, most test files unusable at baseline)
stops synthesis before step 3 with WeakSuiteError; a task with too few PASS_TO_PASS tests, or whose problem statement
opens as a kept task's does, is skipped. With `weak_suite="warn"` nothing is refused or skipped: each problem is an
event, and `hrl tasks check` flags the tasks (their `synth.suite` record keeps what was measured and the limits).

Deterministic for a given sdist, seed and configuration (assuming the package's tests are).
"""

from __future__ import annotations

import asyncio
import random
import shlex
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.scratch import scratch
from hrl.runners.tasks.mutate import Mutation, apply_mutation, find_mutations
from hrl.runners.tasks.patches import file_diff, join_patches
from hrl.runners.tasks.results import PASSING, failure_sections, outcome, parse_summary
from hrl.runners.tasks.sandbox_images import SWE_IMAGE
from hrl.runners.tasks.sdist import SourceTree, download_sdist, read_sdist
from hrl.runners.tasks.suite import SuiteConfig, SuiteStats, WeakSuiteError, opening
from hrl.runners.tasks.task import PYTEST, Task, pack_snapshot, write_tasks
from hrl.runners.tasks.validate import check_task
from hrl.runners.tasks.verifier import TestVerifier, TestVerifierConfig
from hrl.sandboxes import Sandbox, SandboxSpec, get_backend

__all__ = ["SynthConfig", "synthesize", "synthesize_async", "synthesize_warning"]

Events = Callable[[dict[str, Any]], None]
WORKDIR = "/testbed"


class SynthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    image: str = Field(SWE_IMAGE, description="Image the tests run in (baseline, mutants, validation).")
    sandbox: str = Field("docker", description="Sandbox backend name.")
    max_fail_to_pass: int = Field(10, description="Most FAIL_TO_PASS tests listed per task.")
    max_pass_to_pass: int = Field(30, description="Most PASS_TO_PASS tests listed per task.")
    max_broken: int = Field(40, description="A mutant breaking more tests than this is skipped (a crash, not a bug).")
    max_test_file_s: float = Field(30.0, description="Test files slower than this at baseline (s) are not used.")
    max_task_test_s: float = Field(8.0, description="Budget (s, at baseline) for the test files one task runs.")
    tries_per_task: int = Field(10, description="Mutants tried per task asked for, at most.")
    max_problem_chars: int = Field(2500, description="Cap on the problem statement's length, in characters.")
    validate_tasks: bool = Field(True, description="Grade gold and empty patches; keep only valid tasks.")
    suite: SuiteConfig = Field(default_factory=SuiteConfig, description="Below these the suite is too weak.")
    weak_suite: Literal["refuse", "warn"] = Field(
        "refuse",
        description="refuse: a weak suite stops synthesis (WeakSuiteError) and weak tasks are skipped. warn: both "
        "are kept and said (events; `hrl tasks check` flags the tasks).",
    )


def synthesize_warning(
    package: str, version: str | None, n: int, seed: int, out: Path, *, sdist: Path | None, config: SynthConfig,
    on_event: Events, say: Callable[[str], object],
) -> tuple[list[Task], dict[str, list[str]]]:  # fmt: skip
    """`synthesize` as `hrl tasks synth` runs it: the grading image built first on docker, and a warning said to `say`,
    whatever `on_event` shows, for each problem of a suite too weak to guard its package (`config.weak_suite: warn`:
    the one thing a person must not miss) and of each task flagged weak. The tasks and each weak one's problems."""
    from hrl.runners.tasks.sandbox_images import ensure_image
    from hrl.runners.tasks.suite import task_problems

    if config.sandbox == "docker":
        ensure_image(on_event=on_event)
    said: list[str] = []

    def warn(event: dict[str, Any]) -> None:
        on_event(event)
        if config.weak_suite == "warn" and event.get("event") == "synth_suite" and event["problems"]:
            for problem in event["problems"]:  # refused: the error says it, once
                say(f"Warning: weak test suite: {problem}")
            said.extend(event["problems"])

    tasks = synthesize(package, version, n, seed, out, sdist=sdist, config=config, on_event=warn)
    weak = task_problems(tasks)
    for instance_id, problems in weak.items():  # what the suite's warning did not say already
        if rest := [p for p in problems if p not in said]:
            say(f"Warning: {instance_id}: {'; '.join(rest)}")
    return tasks, weak


def synthesize(
    package: str,
    version: str | None = None,
    n: int = 10,
    seed: int = 0,
    out: str | Path | None = None,
    **kwargs: Any,
) -> list[Task]:
    """Blocking `synthesize_async`."""
    return asyncio.run(synthesize_async(package, version, n, seed, out, **kwargs))


async def synthesize_async(
    package: str,
    version: str | None = None,
    n: int = 10,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    sdist: str | Path | None = None,
    config: SynthConfig | None = None,
    on_event: Events | None = None,
) -> list[Task]:
    """Up to `n` validated tasks from `package` (`version`, or the latest); `sdist` skips the download. Written
    to `out` as JSONL when given. Raises SdistError when the package does not qualify, WeakSuiteError when its suite
    is too weak to guard it (unless `config.weak_suite` is warn)."""
    cfg, emit = config or SynthConfig(), on_event or (lambda event: None)
    with scratch("synth") as tmp:
        path = Path(sdist) if sdist else await asyncio.to_thread(download_sdist, package, version, Path(tmp))
        tree = read_sdist(path, package)
    emit({"event": "synth_sdist", "package": tree.name, "version": tree.version, "modules": len(tree.source_modules)})
    backend = get_backend(cfg.sandbox)
    verifier = TestVerifier(backend, TestVerifierConfig(image=cfg.image))
    spec = SandboxSpec(image=cfg.image, workdir=WORKDIR, env=_env(tree), network="none")
    tasks: list[Task] = []
    async with await backend.create(spec, "hrl-synth", f"{tree.name}-{seed}") as sandbox:
        with scratch("synth-tree") as tmp:
            await asyncio.to_thread(_write_tree, tree.files, Path(tmp))
            await sandbox.copy_in(str(tmp), WORKDIR)
        passing, durations, unusable = await _baseline(sandbox, tree, cfg)
        emit({"event": "synth_baseline", "tests": len(passing), "files": sorted(durations)})
        stats = SuiteStats(len(tree.test_modules), len(passing), unusable)
        _judge_suite(tree, stats, cfg, emit)
        record = {**stats.to_dict(), "limits": cfg.suite.model_dump()}
        used: set[tuple[str, str]] = set()
        for tried, m in enumerate(_candidates(tree, seed)):
            if len(tasks) >= n or tried >= n * cfg.tries_per_task:
                break
            if (m.path, m.function) in used:
                continue
            task = await _try_mutant(sandbox, tree, m, passing, durations, seed, cfg, emit)
            if task is None:
                continue
            task.synth["suite"] = record  # type: ignore[attr-defined]  # what `hrl tasks check` judges it by
            if cfg.weak_suite == "refuse" and (why := _weak_task(task, tasks, cfg.suite)):
                emit({"event": "synth_skipped", "instance_id": task.instance_id, "why": why})
                continue
            if cfg.validate_tasks:
                check = await check_task(verifier, task)
                emit({"event": "synth_validated", **check.to_dict()})
                if not check.ok:
                    continue
            used.add((m.path, m.function))
            tasks.append(task)
            emit({"event": "synth_task", "instance_id": task.instance_id, "count": len(tasks)})
    if out is not None:
        write_tasks(tasks, out)
    return tasks


def _write_tree(files: dict[str, str], dest: Path) -> None:
    dest.chmod(0o755)
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)


def _env(tree: SourceTree) -> dict[str, str]:
    return {"PYTHONPATH": tree.import_root}


async def _pytest(sandbox: Sandbox, files: list[str], timeout_s: float) -> tuple[dict[str, str], str, float, bool]:
    cmd = " ".join([PYTEST, *map(shlex.quote, files)])
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    run = await sandbox.exec(["bash", "-c", cmd], timeout_s=timeout_s, env=env)
    return parse_summary(run.stdout), run.stdout, run.duration_s, run.timed_out


async def _baseline(
    sandbox: Sandbox, tree: SourceTree, cfg: SynthConfig
) -> tuple[set[str], dict[str, float], dict[str, str]]:
    """Tests that pass twice (alone per file, then all usable files together), each usable file's runtime, and why
    each other test file is not used."""
    durations: dict[str, float] = {}
    unusable: dict[str, str] = {}
    first: set[str] = set()
    for file in tree.test_modules:
        results, stdout, seconds, timed_out = await _pytest(sandbox, [file], cfg.max_test_file_s)
        ok = {t for t, s in results.items() if s in PASSING and t.startswith(file + "::")}
        if ok and not timed_out:
            durations[file], first = seconds, first | ok
        else:
            unusable[file] = _unused_because(file, results, stdout, timed_out, cfg.max_test_file_s)
    if not durations:
        return set(), {}, unusable
    results, _, _, _ = await _pytest(sandbox, sorted(durations), cfg.max_test_file_s * len(durations))
    return {t for t in first if results.get(t) in PASSING}, durations, unusable


def _unused_because(file: str, results: dict[str, str], stdout: str, timed_out: bool, limit_s: float) -> str:
    """Why a test file is left out of the suite, in a few words: too slow, or its first error line, or no pass."""
    if timed_out:
        return f"slower than max_test_file_s={limit_s:g}"
    error = next((line[1:].strip() for line in stdout.splitlines() if line.startswith("E ")), "")
    if results.get(file) == "ERROR" or not results:
        return f"does not import: {error[:120]}" if error else "collects no test"
    return "no test passes"


def _judge_suite(tree: SourceTree, stats: SuiteStats, cfg: SynthConfig, emit: Events) -> None:
    """Say the suite's measure (event `synth_suite`, with its problems); refuse a weak one unless told to warn."""
    problems = stats.problems(cfg.suite)
    emit({"event": "synth_suite", **stats.to_dict(), "problems": problems})
    if problems and cfg.weak_suite == "refuse":
        raise WeakSuiteError(
            f"{tree.name} {tree.version}: its test suite is too weak to guard the package: {'; '.join(problems)}",
            hint="pick a package whose sdist's tests run on their own (-v shows each file's baseline), lower the "
            "limits (-c suite.min_tests=N), or write the tasks anyway with --allow-weak-suite (hrl tasks check "
            "flags them)",
        )


def _weak_task(task: Task, kept: list[Task], limits: SuiteConfig) -> str:
    """Why synthesis skips a task ('' to keep it): too few PASS_TO_PASS tests, or a statement that opens as a kept
    task's does."""
    if len(task.PASS_TO_PASS) < limits.min_pass_to_pass:
        return f"{len(task.PASS_TO_PASS)} PASS_TO_PASS tests (min_pass_to_pass={limits.min_pass_to_pass})"
    mine = opening(task, limits.opening_chars)
    same = next((k.instance_id for k in kept if mine and opening(k, limits.opening_chars) == mine), None)
    return f"its problem statement opens as {same}'s does" if same else ""


def _candidates(tree: SourceTree, seed: int) -> list[Mutation]:
    """All mutation sites, shuffled by the seed, kinds interleaved round-robin."""
    rng = random.Random(f"hrl-synth:{tree.name}:{tree.version}:{seed}")
    by_kind: dict[str, list[Mutation]] = defaultdict(list)
    for path in tree.source_modules:
        for m in find_mutations(path, tree.files[path]):
            by_kind[m.kind].append(m)
    queues = []
    for kind in sorted(by_kind):
        rng.shuffle(by_kind[kind])
        queues.append(by_kind[kind])
    rng.shuffle(queues)
    order: list[Mutation] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop())
    return order


async def _try_mutant(
    sandbox: Sandbox,
    tree: SourceTree,
    m: Mutation,
    passing: set[str],
    durations: dict[str, float],
    seed: int,
    cfg: SynthConfig,
    emit: Events,
) -> Task | None:
    original = tree.files[m.path]
    mutant = apply_mutation(original, m)
    await sandbox.write_file(m.path, mutant.encode())
    try:
        limit = max(30.0, 4 * sum(durations.values()))
        results, stdout, _, timed_out = await _pytest(sandbox, sorted(durations), limit)
    finally:
        await sandbox.write_file(m.path, original.encode())
    broken = sorted(t for t in passing if outcome(results, t) not in PASSING)
    crashed = timed_out or not results or any("::" not in t and s == "ERROR" for t, s in results.items())
    status = (
        "crash" if crashed else "survived" if not broken else "too_broad" if len(broken) > cfg.max_broken else "kept"
    )
    emit({"event": "synth_mutant", "mutation": m.describe(), "status": status, "broken": len(broken)})
    if status != "kept":
        return None
    rng = random.Random(f"{seed}:{m.key}")
    files = _pick_files(broken, durations, cfg.max_task_test_s)
    if not files:
        return None
    f2p = sorted(t for t in broken if t.split("::")[0] in files)
    f2p = sorted(rng.sample(f2p, cfg.max_fail_to_pass)) if len(f2p) > cfg.max_fail_to_pass else f2p
    p2p = sorted(t for t in passing if t.split("::")[0] in files and t not in broken)
    p2p = sorted(rng.sample(p2p, cfg.max_pass_to_pass)) if len(p2p) > cfg.max_pass_to_pass else p2p
    return _make_task(tree, m, mutant, f2p, p2p, files, stdout, seed, cfg)


def _pick_files(broken: list[str], durations: dict[str, float], budget_s: float) -> list[str]:
    """Test files holding broken tests, fastest first, while their baseline runtime fits the budget."""
    files = sorted({t.split("::")[0] for t in broken}, key=lambda f: (durations.get(f, 1e9), f))
    picked, total = [], 0.0
    for f in files:
        if total + durations.get(f, 1e9) > budget_s:
            break
        picked.append(f)
        total += durations[f]
    return picked


def _make_task(
    tree: SourceTree, m: Mutation, mutant: str, f2p: list[str], p2p: list[str], files: list[str], output: str,
    seed: int, cfg: SynthConfig,
) -> Task:  # fmt: skip
    base = {p: t for p, t in tree.files.items() if not tree.is_test(p)}
    base[m.path] = mutant
    hidden = sorted(p for p in tree.files if tree.is_test(p) and (p in files or p not in tree.test_modules))
    test_patch = join_patches([file_diff(p, None, tree.files[p]) for p in hidden])
    return Task.model_validate(
        {
            "instance_id": f"pypi__{tree.name}-{tree.version}-{m.key}",
            "repo": f"pypi/{tree.name}",
            "version": tree.version,
            "repo_snapshot": pack_snapshot({p: t.encode() for p, t in base.items()}),
            "problem_statement": _problem(tree, f2p, output, cfg.max_problem_chars),
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
            "test_patch": test_patch,
            "patch": file_diff(m.path, mutant, tree.files[m.path]),
            "image": cfg.image,
            "workdir": WORKDIR,
            "env": _env(tree),
            "test_cmd": " ".join([PYTEST, *map(shlex.quote, f2p + p2p)]),  # only the listed tests: fast grading
            "synth": {"source": "hrl tasks synth", "seed": seed, "mutation": m.describe(), "kind": m.kind},
        }
    )


def _problem(tree: SourceTree, f2p: list[str], output: str, max_chars: int) -> str:
    """A bug report written from the failing tests' output: which tests fail, and how the first one fails."""
    sections = failure_sections(output.replace(f"{WORKDIR}/", ""))
    names = [t.split("::")[-1] for t in f2p]
    ours = [text for head, text in sections.items() if any(head == n or head.endswith("." + n) for n in names)]
    first = next(iter(ours or sections.values()), "")
    lines = [line for line in first.strip().splitlines() if line.strip()][:40]
    listed = "\n".join(f"- {t}" for t in f2p)
    count = f"{len(f2p)} tests of its test suite fail" if len(f2p) != 1 else "1 test of its test suite fails"
    text = (
        f"After a recent change to `{tree.name}` ({tree.version}), {count}:\n\n"
        f"{listed}\n\nThe first failure:\n\n```\n" + "\n".join(lines) + "\n```\n\n"
        "Find the bug in the library and fix it, so that these tests pass again without breaking anything else. "
        "The test suite is not part of the repository; change only the library code."
    )
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n…(truncated)\n```"
