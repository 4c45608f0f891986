"""`hrl tasks check` below the CLI: five tasks graded for real in local sandboxes, gold and no change twice each,
and each classed right: a sound one, one whose gold patch fails, one that passes with no change, one with a flaky
test, and one whose PASS_TO_PASS holds a skipped test. Then the cache, and what `filter_checked` keeps.

The flaky test is flaky every time, by construction. A local sandbox starts from nothing (its own folders, its own
/tmp, the host's files read-only under bubblewrap), so what can differ between two fresh sandboxes is the host. A
unix socket in a host folder still takes connections inside a read-only mount (a read-only file system refuses
writes to files, folders and links only), so the flaky task's `env` names one, and a server in this test process counts
the connections per state of m.py (the gold's and the base's apart): the first run of a patch reads 1 and passes,
the second reads 2 and fails, whatever order the runs go in. Nothing depends on timing or chance.
"""

from __future__ import annotations

import json
import os
import socketserver
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hrl.runners.tasks.patches import file_diff
from hrl.runners.tasks.task import PYTEST, Task, write_tasks
from hrl.runners.tasks.task_checks import (
    TaskCheckResult,
    cache_dir,
    check_tasks,
    classify,
    content_hash,
    filter_checked,
    read_check,
    select_for_run,
)
from hrl.runners.tasks.verifier import Verdict

BUGGY = "def f(x):\n    return x - 1\n"
GOOD = "def f(x):\n    return x + 1\n"
TESTS = """import os
import socket

import pytest

from m import f


def test_fix():
    assert f(1) == 2


def test_keep():
    assert f(0) in (-1, 1)


def test_counter():  # the n-th run of this state of m.py reads n (see the module docstring): odd passes
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["HRL_CHECK_COUNTER"])
        s.sendall(open("m.py", "rb").read().hex().encode() + b"\\n")
        assert int(s.makefile().readline()) % 2 == 1


@pytest.mark.skip(reason="not on this platform")
def test_skipped():
    raise AssertionError("never runs")
"""
T = "tests/test_m.py::"
# A SKIPPED PASS_TO_PASS test (a mark in the task's own test file): left out, as the official SWE-bench rule does,
# so the gold resolves and the task is ok.
SKIPPED_P2P = "ok"
EXPECTED = {
    "sound": "ok", "gold-fails": "gold_fails", "noop-passes": "noop_passes", "flaky": "flaky",
    "skipped-p2p": SKIPPED_P2P,
}  # fmt: skip


def _socket_folder() -> Path:
    """A host folder a local sandbox sees: not under /tmp or $TMPDIR (each sandbox gets its own in their place)."""
    temps = [Path("/tmp").resolve(), Path(tempfile.gettempdir()).resolve()]
    for base in (Path("/var/tmp"), Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser(), Path.home()):
        if base.is_dir() and os.access(base, os.W_OK) and not any(base.resolve().is_relative_to(t) for t in temps):
            return Path(tempfile.mkdtemp(prefix="hrl-check-", dir=base))
    raise AssertionError("no writable folder outside the temp folders for the counter's socket")


@pytest.fixture
def counter() -> Iterator[str]:
    """The path of a unix socket that answers each connection with how many times its first line was sent."""
    seen: dict[bytes, int] = {}
    lock = threading.Lock()

    class Count(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            key = self.rfile.readline()
            with lock:
                seen[key] = seen.get(key, 0) + 1
                n = seen[key]
            self.wfile.write(f"{n}\n".encode())

    folder = _socket_folder()
    server = socketserver.ThreadingUnixStreamServer(str(folder / "counter.sock"), Count)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield str(folder / "counter.sock")
    finally:
        server.shutdown()
        server.server_close()
        (folder / "counter.sock").unlink(missing_ok=True)
        folder.rmdir()


def _task(name: str, *, base: str = BUGGY, gold: str = GOOD, p2p: tuple[str, ...] = (), counter: str = "") -> Task:
    """A task on tests/test_m.py (FAIL_TO_PASS test_fix, PASS_TO_PASS test_keep and `p2p`); only a task given the
    `counter` socket reaches it (test_counter fails on its own elsewhere, unlisted), so no other task's runs count."""
    cmd = PYTEST.replace("python", sys.executable, 1)  # the host's pytest: a local sandbox runs on this machine
    return Task(
        instance_id=name, repo="local/m", repo_snapshot={"m.py": base}, problem_statement="f(1) should be 2",
        FAIL_TO_PASS=[f"{T}test_fix"], PASS_TO_PASS=[f"{T}test_keep", *(T + t for t in p2p)],
        test_patch=file_diff("tests/test_m.py", None, TESTS), patch=file_diff("m.py", base, gold),
        env={"PYTHONPATH": ".", **({"HRL_CHECK_COUNTER": counter} if counter else {})},
        test_cmd=f"{cmd} tests/test_m.py",
    )  # fmt: skip


def check_file_tasks(counter: str) -> list[Task]:
    """The five tasks of `EXPECTED`, in its order."""
    return [
        _task("sound"),
        _task("gold-fails", gold=BUGGY.replace("x - 1", "x + 2")),
        _task("noop-passes", base=GOOD, gold=GOOD + "# done\n"),
        _task("flaky", p2p=("test_counter",), counter=counter),
        _task("skipped-p2p", p2p=("test_skipped",)),
    ]


def write_check_file(path: Path, counter: str) -> Path:
    return write_tasks(check_file_tasks(counter), path)


def test_five_tasks_are_classed_cached_and_filtered(tmp_path: Path, counter: str) -> None:
    tasks, cache = check_file_tasks(counter), tmp_path / "cache"
    results = check_tasks(tasks, runs=2, sandbox="local", concurrency=4, cache=cache)
    assert {r.instance_id: r.status for r in results} == EXPECTED, [r.problems for r in results]
    by = {r.instance_id: r for r in results}
    # the flaky test is named, with its outcome in each run, on both sides; no other test changed
    assert {side: {t: sorted(o) for t, o in tests.items()} for side, tests in by["flaky"].changed.items()} == {
        "gold": {f"{T}test_counter": ["FAILED", "PASSED"]}, "noop": {f"{T}test_counter": ["FAILED", "PASSED"]},
    }  # fmt: skip
    assert by["sound"].gold_rewards == [1.0, 1.0] and by["sound"].noop_rewards == [0.0, 0.0]
    assert by["noop-passes"].noop_rewards == [1.0, 1.0] and by["gold-fails"].gold_rewards == [0.0, 0.0]
    saved = json.loads((cache / f"{content_hash(tasks[0]).removeprefix('sha256:')}.json").read_text())
    assert saved["status"] == "ok" and saved["runs"] == 2 and saved["sandbox"] == "local" and saved["hrl_version"]

    again = check_tasks(tasks, runs=2, sandbox="local", cache=cache)  # from the cache: nothing graded
    assert all(r.cached for r in again) and [r.status for r in again] == [r.status for r in results]
    # graded again for more runs, another sandbox kind or another hrl version; an infra result is always retried
    assert not results[0].reusable(3, "local") and not results[0].reusable(2, "docker")
    assert not replace(results[0], hrl_version="0.0.1").reusable(2, "local")
    assert not replace(results[0], status="infra").reusable(2, "local")

    new = _task("never-checked", gold=GOOD + "# other\n")
    kept, report = filter_checked([*tasks, new], cache=cache)
    assert [t.instance_id for t in kept] == [i for i, s in EXPECTED.items() if s == "ok"] + ["never-checked"]
    assert report.left_out == {i: s for i, s in EXPECTED.items() if s != "ok"}
    assert report.unchecked == ["never-checked"]
    line = report.line()
    assert line.startswith(f"tasks: {len(kept)} of 6 used; {len(report.left_out)} left out by `hrl tasks check` (")
    assert "noop_passes: noop-passes; flaky: flaky); 1 unchecked (`hrl tasks check` them)" in line, line
    everything, loose = filter_checked([*tasks, new], include_unchecked=True, cache=cache)
    assert len(everything) == 6 and loose.left_out == {} and loose.not_ok_used == report.left_out


def test_a_resumed_run_takes_the_tasks_its_first_start_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's task_checks.json decides on resume: a check made since (here: every task found flaky) changes
    nothing for a run already under way."""
    monkeypatch.setenv("HRL_CACHE", str(tmp_path / "cache"))
    tasks = [_task("a"), _task("b", gold=GOOD + "# b\n")]
    kept, first = select_for_run(tasks, tmp_path, "tasks")
    assert [t.instance_id for t in kept] == ["a", "b"] and first.unchecked == ["a", "b"]
    for task in tasks:  # both checked since, and not ok
        known = TaskCheckResult(task.instance_id, content_hash(task), "flaky", 2, "local")
        cache_dir().mkdir(parents=True, exist_ok=True)
        (cache_dir() / f"{known.content_hash.removeprefix('sha256:')}.json").write_text(json.dumps(known.to_dict()))
    assert filter_checked(tasks)[0] == []  # a new run would leave both out
    again, report = select_for_run(tasks, tmp_path, "tasks")
    assert [t.instance_id for t in again] == ["a", "b"] and report == first


def test_a_skipped_pass_to_pass_test_does_not_fail_the_gold(tmp_path: Path) -> None:
    [result] = check_tasks([_task("skipped-p2p", p2p=("test_skipped",))], runs=1, sandbox="local",
                           cache=tmp_path)  # fmt: skip
    assert result.status == "ok", result.problems


def test_the_content_hash_follows_grading_not_wording(tmp_path: Path) -> None:
    task = _task("a", counter="/nowhere")
    reworded = task.model_copy(update={"instance_id": "b", "problem_statement": "fix f"})
    assert content_hash(reworded) == content_hash(task)
    assert content_hash(task.model_copy(update={"patch": ""})) != content_hash(task)
    assert content_hash(task.model_copy(update={"env": {}})) != content_hash(task)
    assert read_check(content_hash(task), tmp_path) is None  # never checked


def _ran(reward: float | None, **tests: str) -> Verdict:
    if reward is None:
        return Verdict.error("grading sandbox failed: no space left")
    return Verdict(reward, {"tests": {f"{T}{k}": v for k, v in tests.items()}})


@pytest.mark.parametrize(
    ("gold", "noop", "status"),
    [
        # a grading failure says nothing of the task, whatever else happened
        ([_ran(1.0, a="PASSED"), _ran(None)], [_ran(0.0, a="FAILED")] * 2, "infra"),
        # a test that timed out in one run (no outcomes) changed: flaky, before the gold's failure
        ([_ran(0.0), _ran(0.0, a="FAILED")], [_ran(0.0, a="FAILED")] * 2, "flaky"),
        # Harbor verdicts name no tests: a reward that changed is flaky
        ([_ran(1.0), _ran(0.0)], [_ran(0.0)] * 2, "flaky"),
        ([_ran(0.0, a="FAILED")] * 2, [_ran(0.0, a="FAILED")] * 2, "gold_fails"),
        ([_ran(1.0, a="PASSED")] * 2, [_ran(1.0, a="PASSED")] * 2, "noop_passes"),
        ([_ran(1.0, a="PASSED")] * 2, [_ran(0.0, a="FAILED")] * 2, "ok"),
    ],
)
def test_the_first_class_that_applies_wins(gold: list[Verdict], noop: list[Verdict], status: str) -> None:
    got, changed, problems = classify(gold, noop)
    assert got == status, problems
    assert bool(changed) == (status == "flaky") and bool(problems) == (status != "ok")
