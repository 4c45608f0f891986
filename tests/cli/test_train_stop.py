"""`hrl train` stopped before its first step, through the real CLI on the tiny model: `kill PID` (SIGTERM) during the
step-0 held-out evaluation ends the run within seconds with nothing of it left (processes, local sandboxes, warm
ones among them, the proxy's socket), and the resume command the run printed continues it from there, as it does
after a stop in the first rollout. A run directory that holds a run is never overwritten by a new one.

The demo recipe: mini-swe-agent in local sandboxes, made ahead by the warm pool with the harness started in them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hrl.recipes
from hrl.runners.rundir import RunDir
from hrl.runners.trace import read_traces
from tests.cli.test_error_policy import USAGE, run_hrl
from tests.cli.test_train_resume import _alive, _descendants, _with_env

HRL = [sys.executable, "-m", "hrl.cli", "train"]
TINY = [
    "--recipe", "demo", "--iterations", "1", "-c", "train.tasks_per_iteration=1", "-c", "train.group_size=2",
    "-c", "train.concurrency=2", "-c", "rollout.agent_options.step_limit=1", "-c", "proxy.default_max_tokens=16",
]  # fmt: skip
STOP_S = 20.0  # a stop's bound on a loaded 2-core machine: kills and deletes, nothing that waits for the model
INTERRUPTED = 130


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A private, short TMPDIR for the run and its resume: whatever the stopped process left is in it."""
    path = Path(tempfile.mkdtemp(prefix="hrl-stop-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(tiny_model: str, scratch: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(scratch), "NO_COLOR": "1"}
    args = [*HRL, *TINY, "--model", tiny_model, "--run-dir", str(scratch / "run"), *extra]
    with (scratch / "first.log").open("w") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=log, start_new_session=True)


def _wait_for(proc: subprocess.Popen, scratch: Path, line: str, then: float = 2.0) -> None:
    """Until the run's stderr shows `line`, then `then` seconds more (episodes under way)."""
    deadline = time.monotonic() + 300
    while line not in (scratch / "first.log").read_text():
        assert proc.poll() is None, (scratch / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"{line!r} never came"
        time.sleep(0.1)
    time.sleep(then)


def _sigterm(proc: subprocess.Popen, scratch: Path) -> float:
    """`kill PID`; the seconds until the process ended (SIGKILL to its group past the bound, so nothing lingers)."""
    below = _descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"alive {STOP_S:.0f} s after SIGTERM: {(scratch / 'first.log').read_text()[-3000:]}")
    took = time.monotonic() - t0
    assert proc.returncode == INTERRUPTED, (scratch / "first.log").read_text()[-3000:]
    assert _running(below) == [] and _with_env("TMPDIR", str(scratch)) == []
    assert sorted(p.name for p in scratch.glob("hrl-sbx-*")) == []  # the episodes' and the warm pool's
    assert sorted(p.name for p in scratch.glob("hrl-proxy-*")) == []  # the proxy's socket folder
    return took


def _running(pids: dict[int, str]) -> list[str]:
    """The processes of `pids` still there and not zombies (ended, waiting for a parent to reap them: here, a
    container's init that may take its time)."""
    return [p for p in _alive(pids) if _state(int(p.split(":")[0])) not in ("Z", "")]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _resume(scratch: Path) -> subprocess.CompletedProcess:
    printed = (scratch / "first.log").read_text()
    command = f"hrl train --run-dir {scratch / 'run'} --resume"
    assert command in printed, printed  # the command the run printed, run as printed
    env = {**os.environ, "TMPDIR": str(scratch), "NO_COLOR": "1"}
    return subprocess.run([*HRL, "--run-dir", str(scratch / "run"), "--resume"], env=env, capture_output=True,
                          text=True, timeout=500)  # fmt: skip


@pytest.mark.agents
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_in_the_step_0_evaluation_stops_cleanly_and_the_run_resumes(tiny_model: str, scratch: Path) -> None:
    held = scratch / "held.jsonl"
    demo = Path(hrl.recipes.__path__[0]) / "demo" / "heldout.jsonl"
    held.write_text("".join(demo.read_text().splitlines(keepends=True)[:2]))
    proc = _start(tiny_model, scratch, "-c", f"eval_tasks={held}")  # the demo's warm pool: 2, the batch's size
    try:
        _wait_for(proc, scratch, "held-out evaluation at step 0")
        took = _sigterm(proc, scratch)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    run = RunDir(scratch / "run")
    assert not run.exists() and run.eval_rows() == {}  # stopped before any step or evaluation was logged
    print(f"\nSIGTERM in the step-0 evaluation: exit {INTERRUPTED} after {took:.1f} s")

    resumed = _resume(scratch)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert run.state()["iteration"] == 1 and sorted(run.eval_rows()) == [0, 1]
    evaluated = list(read_traces(run.eval_trace_file(0)))  # the cut-short evaluation, run again whole
    assert len(evaluated) == 2 and all(t["failure_reason"] != "cancelled" for t in evaluated), evaluated
    assert sorted(p.name for p in scratch.glob("hrl-sbx-*")) == []


@pytest.mark.agents
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_stopped_in_its_first_rollout_resumes_and_runs_its_step(tiny_model: str, scratch: Path) -> None:
    proc = _start(tiny_model, scratch, "-c", "eval_tasks=")
    try:
        _wait_for(proc, scratch, "iteration 0: 2 episodes", then=1.0)
        _sigterm(proc, scratch)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    run = RunDir(scratch / "run")
    assert not run.exists()

    resumed = _resume(scratch)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert run.state()["iteration"] == 1 and sorted(run.metric_rows()) == [0]
    traces = run.iteration_traces(0)
    assert len(traces) == 2 and all(t["failure_reason"] != "cancelled" for t in traces)


def test_a_new_run_in_a_directory_that_holds_one_is_refused_untouched(tmp_path, monkeypatch, capsys):
    """A run stopped before its first step has a config.json and no state.json: a new run of another recipe there
    is refused before anything is written (it overwrote the config, then blamed `hrl tasks check`)."""
    run = RunDir(tmp_path / "old")
    run.create({"recipe": "demo", "model": "m", "tasks": "t.jsonl", "rollout": {"run_id": "hrl-old"}})
    checks = {"tasks": {"total": 1, "kept": ["demo-0"], "left_out": {}, "unchecked": ["demo-0"]}}  # demo's tasks
    (run.path / "task_checks.json").write_text(json.dumps(checks) + "\n")
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    monkeypatch.chdir(tmp_path)
    code, _out, err = run_hrl(["train", "--recipe", "langgraph-react", "--run-dir", str(run.path)], {}, monkeypatch,
                              capsys)  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    hints = [line for line in err.splitlines() if line.startswith("Hint: ")]
    assert code == USAGE and len(errors) == 1 and len(hints) == 1, err
    assert str(run.path) in errors[0] and "demo" in errors[0] and "tasks check" not in err, err
    assert "--resume" in hints[0] and "another --run-dir" in hints[0], hints
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before  # no lock file either


def test_resume_of_a_directory_without_a_run_names_it(tmp_path, monkeypatch, capsys):
    code, _out, err = run_hrl(["train", "--run-dir", str(tmp_path), "--resume"], {}, monkeypatch, capsys)
    assert code == USAGE and f"{tmp_path} holds none (no config.json)" in err, err
    assert list(tmp_path.iterdir()) == []
