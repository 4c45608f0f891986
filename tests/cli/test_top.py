"""`hrl top RUN --once`: the episodes in flight of a real running `hrl train` and `hrl rollout` (their state and the
policy version each started on), the run marked finished once it ends, and a status file whose writer died shown as
not running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from hrl.cli.main import app
from hrl.runners.live import LIVE_FILE, STALE_AFTER_S, LiveStatus

# A white-box agent that waits at a gate (a file beside it) before its one model call: its episodes stay in flight
# until the test has seen them, whatever the speed of the machine.
GATED_AGENT = """
import asyncio
from pathlib import Path

async def run(task, session):
    while not Path(__file__).with_name("gate").exists():
        await asyncio.sleep(0.05)
    reply = await session.openai().chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=8)
    return None
"""


def top(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app, ["top", *args], catch_exceptions=False)
    return out.exit_code, out.stdout


def poll(run: Path, until, timeout_s: float = 120, ready=None) -> dict:
    """`hrl top RUN --once --json` until `until(snapshot)`; the run's own progress bounds the wait, not a guess."""
    deadline, snap = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        if ready() if ready is not None else (run / "traces").is_dir():
            code, out = top(str(run), "--once", "--json")
            assert code == 0, out
            snap = json.loads(out)
            if until(snap):
                return snap
        time.sleep(0.2)
    raise AssertionError(f"hrl top never showed it; last snapshot: {snap}")


def test_top_shows_the_episodes_in_flight_of_a_running_train_then_that_it_finished(tiny_model, tmp_path):
    (tmp_path / "gate.py").write_text(GATED_AGENT)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hrl.cli", "train", "--recipe", "agents-sdk", "--model", tiny_model, "--agent",
           "gate.py:run", "-c", "rollout.mode=inprocess", "--iterations", "1", "-c", "train.tasks_per_iteration=1",
           "-c", "train.group_size=2", "--run-dir", str(run)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        snap = poll(run, lambda s: s["live"] and s["by_state"] == {"agent": 2})  # both waiting at the gate
        assert snap["status"] == "running" and snap["version"] == 0  # the tiny model before any update
        groups = {e["episode"].rsplit("#", 1)[0] for e in snap["in_flight"]}
        assert len(groups) == 1 and sorted(e["episode"][-2:] for e in snap["in_flight"]) == ["#0", "#1"]
        assert all(e["version"] == 0 and e["staleness"] == 0 and not e["pinned"] for e in snap["in_flight"])
        code, human = top(str(run), "--once")
        assert code == 0 and "running (pid" in human and "episodes in flight: 2 (2 agent)" in human, human
    finally:
        (tmp_path / "gate").touch()
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    snap = poll(run, lambda s: True, timeout_s=1)
    assert snap["status"] == "finished" and not snap["live"] and snap["in_flight"] == []
    assert snap["step"] == 1 and len(snap["latest"]) == 2 and sum(snap["failures"].values()) == 2
    code, human = top(str(run), "--once")
    assert code == 0 and f"{run}: finished (ended" in human, human


def test_top_shows_a_running_rollout_from_its_trace_file_then_that_it_finished(tiny_model, tmp_path):
    (tmp_path / "gate.py").write_text(GATED_AGENT)
    out = tmp_path / "traces.jsonl"
    status = tmp_path / f"traces.jsonl.{LIVE_FILE}"  # beside the traces
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--recipe", "agents-sdk", "--model", tiny_model, "--agent",
           "gate.py:run", "-c", "rollout.mode=inprocess", "--limit", "1", "-n", "2", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        snap = poll(out, lambda s: s["live"] and s["by_state"] == {"agent": 2}, ready=status.exists)
        assert snap["kind"] == "rollout" and snap["version"] == 0 and snap["traces"] == 0
        code, human = top(str(out), "--once")
        assert code == 0 and "running (pid" in human and "episodes in flight: 2 (2 agent)" in human, human
        assert "0 traces" in human and "steps" not in human  # nothing is trained: no step table
    finally:
        (tmp_path / "gate").touch()
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    snap = poll(out, lambda s: True, timeout_s=1, ready=status.exists)
    assert snap["status"] == "finished" and snap["in_flight"] == [] and snap["traces"] == 2 and len(snap["latest"]) == 2


def _run_with_status(tmp_path: Path, pid: int, age_s: float) -> Path:
    """A run directory whose live.json the real writer wrote with one episode in flight, then made `age_s` old and
    owned by `pid` (a writer killed mid-run leaves exactly this: state running, no one updating it)."""
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    status = LiveStatus(run, version=lambda: 3)
    status.start("it2:t1#0", "t1", None)
    status.write("running")
    data = json.loads((run / LIVE_FILE).read_text())
    (run / LIVE_FILE).write_text(json.dumps(data | {"pid": pid, "updated_at": data["updated_at"] - age_s}))
    return run


def test_a_status_no_process_keeps_is_shown_as_not_running(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # it has exited: no process has this pid now (short of reuse within the test)
    stale_for = STALE_AFTER_S * 3  # well past the threshold, whatever the pid says
    for pid, age in ((os.getpid(), stale_for), (dead_pid, 0.0)):
        run = _run_with_status(tmp_path / str(pid), pid, age)
        code, out = top(str(run), "--once", "--json")
        snap = json.loads(out)
        assert code == 0 and snap["status"] == "stale" and not snap["live"]
        assert snap["in_flight"] == [] and snap["by_state"] == {}  # the dead writer's episodes are not shown as live
        code, human = top(str(run), "--once")
        assert f"not running (last update {age:.0f}s ago" in human and "episodes in flight: 0" in human, human


def test_a_status_its_writer_keeps_shows_its_episodes(tmp_path):
    run = _run_with_status(tmp_path, os.getpid(), 0.0)  # this process wrote it just now: live
    snap = json.loads(top(str(run), "--once", "--json")[1])
    assert snap["live"] and snap["version"] == 3
    [episode] = snap["in_flight"]
    assert episode["episode"] == "it2:t1#0" and episode["state"] == "starting" and episode["staleness"] == 0
