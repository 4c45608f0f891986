"""`hrl train ... --resume` after `kill -9`, through the real CLI: mini-swe-agent in local sandboxes, the embedded
engine on the tiny model, the swe recipe's test verifier (rewards are 0; what matters is the bookkeeping). Also
the two guards resume relies on: one process per run directory, and no metrics line of an uncommitted step.

The in-process resume test in test_loop.py raises an exception inside the loop, so `finally` blocks still run and
nothing outside the process is involved. Here the whole process group dies mid-iteration with SIGKILL, with agent
CLIs running in their own sessions, and a second process has to pick the run up from what is on disk alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrl.runners.rundir import RunDir
from hrl.runners.trace import read_traces

ITERATIONS, TASKS, GROUP = 2, 2, 2  # killed in iteration 1; the resumed process finishes it and commits the run
PER_ITERATION = TASKS * GROUP
HRL = [sys.executable, "-m", "hrl.cli", "train"]
OVERRIDES = [
    "-c", f"train.tasks_per_iteration={TASKS}", "-c", f"train.group_size={GROUP}", "-c", "train.concurrency=2",
    "-c", "rollout.sandbox=local",  # no container start per episode and per grading
    "-c", "rollout.agent_options.step_limit=1", "-c", "proxy.default_max_tokens=16",  # the tiny model's turns are noise
    "-c", "train.drop_zero_variance=true",  # all rewards are 0, so no group has a gradient: skip the no-op compute
]  # fmt: skip
# Every step trains on nothing (all rewards 0), so none publishes: the version stays 0 and no checkpoint is
# written; what these tests hold to is the process side (no trace lost or run twice, nothing left behind).
# Version continuity across a resume, with steps that publish: tests/train/test_loop.py.
KILL_DEADLINE_S = 240.0


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A private, short TMPDIR for both processes: every sandbox, proxy socket and agent home lands in it, so what
    the killed process left behind is exactly what is in it (and unix socket paths stay under their length cap)."""
    path = Path(tempfile.mkdtemp(prefix="hrl-k9-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _procs() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, start time) of every process (start time tells a live pid from a reused one)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(stat.parent.name)] = (int(fields[1]), fields[19])
    return found


def _descendants(root: int) -> dict[int, str]:
    """pid → start time of every process below `root`, including those that left its session (agent CLIs)."""
    procs, found, frontier = _procs(), {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start) in procs.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pids: dict[int, str]) -> list[str]:
    """The processes of `pids` that still exist (same pid and start time), with their command lines."""
    procs = _procs()
    return [f"{pid}: {_cmdline(pid)[:200]}" for pid, start in pids.items() if procs.get(pid, (0, ""))[1] == start]


def _with_env(name: str, value: str) -> list[str]:
    """Processes whose environment holds name=value (everything the runs started inherits TMPDIR=scratch)."""
    mark, hits = f"{name}={value}".encode(), []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0") and int(environ.parent.name) != os.getpid():
                hits.append(f"{environ.parent.name}: {_cmdline(int(environ.parent.name))[:200]}")
        except (OSError, ValueError):
            continue
    return hits


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.is_file() else 0


def _iteration(run: Path) -> int | None:
    """The committed iteration of the run's state.json."""
    try:
        return int(json.loads((run / "state.json").read_text())["iteration"])
    except (OSError, ValueError, KeyError):
        return None  # not there yet (written atomically, so never half)


@pytest.mark.agents
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hrl_train_resume_after_kill_9_loses_and_repeats_nothing(tiny_model: str, scratch: Path) -> None:
    """The requirement: `hrl train --resume` after `kill -9` continues with no lost or duplicated traces and the
    same next version, and nothing the killed process started outlives the resumed run."""
    run = scratch / "run"
    env = {**os.environ, "TMPDIR": str(scratch)}
    t0 = time.monotonic()

    # 1. A real run, killed once iteration 0 is committed and iteration 1 has some traces and agents running.
    args = [*HRL, "--recipe", "swe", "--model", tiny_model, "--run-dir", str(run), "--iterations", str(ITERATIONS)]
    with (scratch / "first.log").open("w") as log:
        first = subprocess.Popen([*args, *OVERRIDES], env=env, stdout=log, stderr=log, start_new_session=True)
    partial = run / "traces" / "iter-0001.jsonl"
    try:
        while True:
            assert first.poll() is None, (scratch / "first.log").read_text()[-3000:]
            assert time.monotonic() - t0 < KILL_DEADLINE_S, "iteration 1 never got under way"
            if _iteration(run) == 1 and 1 <= _lines(partial) < PER_ITERATION:
                agents = [p for p in _descendants(first.pid) if "mini" in _cmdline(p)]
                if agents:
                    break
            assert _lines(partial) < PER_ITERATION, "iteration 1 finished before an agent was caught running"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGSTOP)  # freeze it: nothing new starts while we look
        killed = _descendants(first.pid)
        before = [t["trace_id"] for t in read_traces(partial)]
        sandboxes = sorted(p.name for p in scratch.glob("hrl-sbx-*"))
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone when it failed on its own
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    kill_s = time.monotonic() - t0
    state = json.loads((run / "state.json").read_text())
    assert (state["iteration"], state["version"]) == (1, 0)
    assert 1 <= len(before) < PER_ITERATION and sandboxes, (before, sandboxes)

    # 2. Resume from what is on disk.
    resumed = subprocess.run(
        [*HRL, "--run-dir", str(run), "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    total_s = time.monotonic() - t0
    print(
        f"\nkilled at {kill_s:.0f}s with {len(before)}/{PER_ITERATION} traces of iteration 1 and "
        f"{len(killed)} processes below hrl ({len(sandboxes)} sandboxes); resumed run ended at {total_s:.0f}s"
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming at iteration 1, version 0" in resumed.stderr, resumed.stderr[-4000:]
    assert f"iteration 1: {PER_ITERATION} episodes ({len(before)} already done)" in resumed.stderr
    assert f"removed {len(sandboxes)} sandboxes left by the interrupted process" in resumed.stderr

    # Every episode exactly once; what the killed process finished is kept, not run again.
    for it in range(ITERATIONS):
        traces = list(read_traces(run / "traces" / f"iter-{it:04d}.jsonl"))
        ids = [t["trace_id"] for t in traces]
        episodes = [t["metadata"]["episode"] for t in traces]
        assert len(traces) == PER_ITERATION == len(set(ids)) == len(set(episodes)), episodes
        assert all(re.fullmatch(rf"it{it}:.+#[0-{GROUP - 1}]", e) for e in episodes), episodes
        assert len({t["group_id"] for t in traces}) == TASKS
        # no step published: every token came from version 0, before the kill and after the resume
        served = {v for t in traces for call in t["calls"] for _, v in call["versions"]}
        assert served == {0}, (it, served)
        if it == 1:
            assert set(before) <= set(ids)

    # One metrics line per step, each empty and counted (the count goes on across the resume); step 1 is the
    # resumed process's first.
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["version"], m["train/empty_steps"]) for m in metrics] == [
        (i, 0, i + 1) for i in range(ITERATIONS)
    ]
    first_step = re.search(r"^step +(\d+) +v(\d+) ", resumed.stderr, re.MULTILINE)
    assert first_step and first_step.groups() == ("1", "0"), resumed.stderr[-4000:]
    state = json.loads((run / "state.json").read_text())
    assert state == {"iteration": ITERATIONS, "version": 0, "checkpoint": None}

    # Nothing of the killed run survives it: no process, no sandbox.
    assert _alive(killed) == []
    assert _with_env("TMPDIR", str(scratch)) == []
    assert sorted(p.name for p in scratch.glob("hrl-sbx-*")) == []


def _all_traces(run: Path) -> list[dict]:
    return [t for f in sorted((run / "traces").glob("iter-*.jsonl")) if ".cancelled" not in f.name
            for t in read_traces(f)]  # fmt: skip


@pytest.mark.agents
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hrl_train_async_resume_after_kill_9_loses_and_repeats_nothing(tiny_model: str, scratch: Path) -> None:
    """`hrl train --async` killed with SIGKILL mid-step, then `--resume`: every trace the killed process wrote is
    still there once, no episode runs twice (the resumed producer starts new groups), each step is committed
    once, and nothing the killed process started outlives the resumed run."""
    run = scratch / "run"
    env = {**os.environ, "TMPDIR": str(scratch)}
    t0 = time.monotonic()
    args = [*HRL, "--recipe", "swe", "--model", tiny_model, "--run-dir", str(run), "--iterations", str(ITERATIONS),
            "--async", "-c", "async.max_in_flight=4", "-c", f"async.batch_traces={PER_ITERATION}",
            "-c", "async.max_staleness=8"]  # fmt: skip
    with (scratch / "first.log").open("w") as log:
        first = subprocess.Popen([*args, *OVERRIDES], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        while True:
            assert first.poll() is None, (scratch / "first.log").read_text()[-3000:]
            assert time.monotonic() - t0 < KILL_DEADLINE_S, "step 1 never got under way"
            if (
                _iteration(run) == 1
                and _descendants(first.pid)
                and any("mini" in _cmdline(p) for p in _descendants(first.pid))
            ):
                break
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGSTOP)
        killed = _descendants(first.pid)
        before = _all_traces(run)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert json.loads((run / "state.json").read_text())["iteration"] == 1

    resumed = subprocess.run(
        [*HRL, "--run-dir", str(run), "--resume"], env=env, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = _all_traces(run)
    ids = [t["trace_id"] for t in after]
    episodes = [t["metadata"]["episode"] for t in after]
    print(f"\nasync kill -9: {len(before)} traces on disk at the kill, {len(after)} after the resume")
    assert len(ids) == len(set(ids)) and len(episodes) == len(set(episodes)), episodes  # nothing twice
    assert {t["trace_id"] for t in before} <= set(ids)  # nothing lost
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["version"]) for m in metrics] == [(i, 0) for i in range(ITERATIONS)]  # none published
    assert json.loads((run / "state.json").read_text())["iteration"] == ITERATIONS
    assert _alive(killed) == []
    assert _with_env("TMPDIR", str(scratch)) == []
    assert sorted(p.name for p in scratch.glob("hrl-sbx-*")) == []


def test_a_resume_is_refused_while_another_process_holds_the_run(tmp_path: Path) -> None:
    """A resume of a run that is still alive would append its episodes a second time and kill its sandboxes."""
    run = RunDir(tmp_path / "run")
    run.create({"rollout": {"sandbox": "local", "run_id": "hrl-busy"}})
    run.save_state(1, 1, None)
    with run.locked():
        out = subprocess.run(
            [*HRL, "--run-dir", str(run.path), "--resume"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        )
    assert out.returncode == 1, out.stderr
    assert "in use by another running process" in out.stderr and "bug" not in out.stderr, out.stderr
    assert run.state() == {"iteration": 1, "version": 1, "checkpoint": None}


def test_resume_drops_the_metrics_line_of_a_step_that_was_never_committed(tmp_path: Path) -> None:
    """The loop logs a step before committing it; killed in between, the step runs again and must not be
    logged twice."""
    run = RunDir(tmp_path / "run")
    run.create({})
    run.save_state(2, 2, None)
    rows = [{"step": i, "version": i + 1} for i in range(3)]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run.discard_uncommitted_metrics() == 1
    kept = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert kept == rows[:2]
    assert run.discard_uncommitted_metrics() == 0


def test_resume_refuses_flags_it_cannot_change_and_names_them(tmp_path: Path) -> None:
    """`--resume` goes on with the run's own config: a flag that would change it is refused (exit 2), by name, and
    nothing is written; only --iterations (to extend the run) and --wandb may come with it."""
    run = RunDir(tmp_path / "run")
    run.create({"rollout": {"sandbox": "local", "run_id": "hrl-fixed"}, "train": {"iterations": 2}})
    run.save_state(2, 2, None)
    before = (run.path / "config.json").read_text()
    out = subprocess.run(
        [*HRL, "--run-dir", str(run.path), "--resume", "--model", "other", "-c", "train.group_size=8"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--model, -c cannot change on --resume" in out.stderr, out.stderr
    assert (run.path / "config.json").read_text() == before
