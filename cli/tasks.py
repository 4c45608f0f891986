"""`hrl tasks`: SWE-bench-format task files — list, validate and check with the real verifier, synthesize offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err, say
from hrl.runners.errors import UsageError

__all__ = ["app"]

app = typer.Typer(help="Task files: list, validate, check, synthesize.", no_args_is_help=True)


def _say(event: dict[str, Any]) -> None:
    """An event as it was emitted, for --verbose."""
    kind = event.get("event", "")
    rest = " ".join(f"{k}={v}" for k, v in event.items() if k != "event")
    err.print(f"  {kind} {rest}", markup=False, highlight=False)


def _progress(verbose: bool) -> Any:
    """Every event with --verbose; else one plain line for the steps a person waits on (an image build, each new
    task of a synthesis), and nothing for the rest."""
    if verbose:
        return _say

    def shown(event: dict[str, Any]) -> None:
        if event.get("event") == "image_build":
            err.print(f"building the grading image {event['tag']} (once; cached after) …", markup=False)
        elif event.get("event") == "synth_task":
            err.print(f"  task {event['count']}: {event['instance_id']}", markup=False, highlight=False)

    return shown


@app.command("ls", epilog="Examples:\n\n  hrl tasks ls recipes/swe/tasks.jsonl\n\n  hrl tasks ls my.jsonl --json")
def ls(
    file: Annotated[Path, typer.Argument(help="Task file (JSONL, JSON array or Parquet).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """One line per task: id, repo, test counts."""
    from hrl.runners.tasks.load import load_tasks, task_summary

    rows = [task_summary(t) for t in load_tasks(file)]
    human = "\n".join(
        f"{r['instance_id']:<48} {r['repo'] or '':<20} F2P {r['fail_to_pass']:>3}  P2P {r['pass_to_pass']:>3}"
        for r in rows
    )
    emit(rows, as_json=as_json, human=human)


app.command("list", hidden=True)(ls)


@app.command(
    "validate",
    epilog="Examples:\n\n  hrl tasks validate recipes/swe/tasks.jsonl\n\n"
    "  hrl tasks validate my.jsonl --sandbox local --concurrency 1 --json",
)
def validate(
    file: Annotated[Path, typer.Argument(help="Task file to check.")],
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "docker",
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks graded at once.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print per-task results as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print each grading event.")] = False,
) -> None:
    """Check every task: the gold patch passes all listed tests (reward 1) and no patch fails FAIL_TO_PASS (reward 0)."""
    from hrl.runners.preflight import check_sandbox, check_tasks
    from hrl.runners.tasks.validate import validate_tasks

    check_sandbox(sandbox)
    check_tasks(file)
    checks = validate_tasks(file, sandbox=sandbox, concurrency=concurrency, on_event=_progress(verbose))
    rows = [c.to_dict() for c in checks]
    human = "\n".join(f"{'✓' if c.ok else '✗'} {c.instance_id}  {'; '.join(c.problems)}" for c in checks)
    emit(rows, as_json=as_json, human=human + f"\n{sum(c.ok for c in checks)}/{len(checks)} tasks valid")
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def _check_line(c: Any) -> str:
    """A task's class and, when not ok, why: the tests that changed (flaky) or what failed."""
    cached = "  (cached)" if c.cached else ""
    why = f"  {'; '.join(c.problems[:3])}" if c.problems else ""
    return f"{c.status:<12} {c.instance_id}{cached}{why}"


@app.command(
    "check",
    epilog="Examples:\n\n  hrl tasks check recipes/swe/tasks.jsonl --runs 3\n\n"
    "  hrl tasks check my.jsonl --sandbox local --runs 5 --json > checks.jsonl\n\n"
    "  hrl tasks check terminal-bench/ --concurrency 4        # Harbor folders: solve.sh is the gold\n\n"
    "  hrl tasks check my.jsonl --recheck                     # grade again whatever the cache holds",
)
def check(
    file: Annotated[Path, typer.Argument(help="Task file, or a folder of Harbor tasks.")],
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs of each patch (K); 2 or more see flaky tests.")] = 3,
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "docker",
    concurrency: Annotated[int, typer.Option(min=1, help="Sandboxes graded at once.")] = 2,
    recheck: Annotated[bool, typer.Option("--recheck", help="Grade again even where the cache has a result.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per task (JSONL).")] = False,
) -> None:
    """Grade each task's gold solution K times and no change K times, each in a fresh sandbox, and class it: ok,
    gold_fails (the gold never scores 1), noop_passes (no change scores 1), flaky (a test's outcome changed between
    runs of one patch; the tests are named), infra (grading failed) or weak_suite (graded fine, but a synthesized task
    whose tests cannot guard its package: too few tests, unusable test files, no PASS_TO_PASS, a problem statement
    that opens as another's). Results are cached by the task's content hash ($HRL_CACHE/task-checks); `hrl train` and
    `hrl eval` leave out the tasks checked and not ok."""
    import json
    import sys

    from hrl.runners.preflight import check_sandbox
    from hrl.runners.tasks.load import load_tasks
    from hrl.runners.tasks.task_checks import STATUSES, check_tasks

    check_sandbox(sandbox)
    tasks = load_tasks(file)
    done = [0]

    def progress(event: dict[str, Any]) -> None:  # long runs: one line a task, on stderr
        done[0] += 1
        how = "cached" if event["cached"] else f"{event['seconds']:.0f} s"
        err.print(f"[{done[0]}/{len(tasks)}] {event['status']} {event['instance_id']} ({how})", markup=False)

    checks = check_tasks(tasks, runs=runs, sandbox=sandbox, concurrency=concurrency, recheck=recheck,
                         on_event=progress)  # fmt: skip
    if as_json:
        sys.stdout.write("".join(json.dumps(c.to_dict()) + "\n" for c in checks))
    else:
        counts = ", ".join(f"{s} {n}" for s in STATUSES if (n := sum(c.status == s for c in checks)))
        emit(None, as_json=False, human="\n".join(map(_check_line, checks)) + f"\n{len(checks)} tasks: {counts}")
    sys.stdout.flush()
    if any(c.status != "ok" for c in checks):
        raise typer.Exit(1)


@app.command(
    "synth",
    epilog="Examples:\n\n  hrl tasks synth --package inflection --n 10 --out tasks.jsonl\n\n"
    "  hrl tasks synth --package toolz --version 1.2.0 --n 5 --seed 1 --out toolz.jsonl\n\n"
    "  hrl tasks synth --package semver --sdist semver-3.1.2.tar.gz --n 3 --out semver.jsonl   # offline\n\n"
    "  hrl tasks synth --package tiny --sdist tiny-0.1.tar.gz --out t.jsonl -c suite.min_tests=5   # a small suite",
)
def synth(
    package: Annotated[str, typer.Option(help="A pure-Python PyPI package whose sdist carries its tests.")],
    out: Annotated[Path, typer.Option(help="Write the validated tasks here (JSONL).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Tasks wanted.")] = 10,
    version: Annotated[str | None, typer.Option(help="Package version (default: latest).")] = None,
    seed: Annotated[int, typer.Option(help="Same seed, same tasks.")] = 0,
    sdist: Annotated[Path | None, typer.Option(help="Use this sdist file instead of downloading.")] = None,
    sandbox: Annotated[str, typer.Option(help="docker | local.")] = "docker",
    as_json: Annotated[bool, typer.Option("--json", help="Print the task summaries as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print each mutant and check.")] = False,
    allow_weak_suite: Annotated[
        bool,
        typer.Option(
            "--allow-weak-suite",
            help="Write the tasks even when the package's suite is too weak to guard it (each problem is a warning; "
            "`hrl tasks check` flags the tasks).",
        ),
    ] = False,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "-c",
            "--config",
            help="KEY=VALUE of the synthesis settings, e.g. suite.min_tests=5, "
            "max_test_file_s=60 (SynthConfig, runners/tasks/synth.py).",
        ),
    ] = None,
) -> None:
    """Build tasks offline: run the package's tests, inject bugs by AST mutation, keep mutants that break some tests,
    write problem statements from the failures, and validate each task with the real verifier. A suite too weak to
    guard the package (few tests kept, most test files failing to import) is refused; so are tasks with no
    PASS_TO_PASS test or a problem statement that opens as another's."""
    from hrl.runners.preflight import check_out_file, check_sandbox
    from hrl.runners.recipe_config import from_overrides
    from hrl.runners.tasks.load import task_summary
    from hrl.runners.tasks.synth import SynthConfig, synthesize_warning

    check_sandbox(sandbox)
    if sdist is not None and not sdist.is_file():
        raise UsageError(f"sdist not found: {sdist}", hint="give the path of a .tar.gz sdist, or leave --sdist out")
    check_out_file(out, "tasks")  # before the work: synthesis runs the package's tests for minutes
    weak_suite = "warn" if allow_weak_suite else "refuse"
    settings = from_overrides(SynthConfig, config or [], "suite.min_tests=5", sandbox=sandbox, weak_suite=weak_suite)
    events = _progress(verbose)
    tasks, weak = synthesize_warning(package, version, n, seed, out, sdist=sdist, config=settings, on_event=events,
                                     say=say)  # fmt: skip
    rows = [task_summary(t) | {"problems": weak.get(t.instance_id, [])} for t in tasks]
    flagged = f" ({len(weak)} flagged weak: `hrl tasks check` classes them weak_suite)" if weak else ""
    emit(rows, as_json=as_json, human=f"{len(tasks)} tasks → {out}{flagged}")
