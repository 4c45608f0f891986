"""Joining a Ray cluster has a deadline (`runners/placement/ray_cluster.py`), on real Ray: an address nobody answers,
or one that accepts and never speaks, is an error naming it within `placement.connect_timeout_s` (exit 4 from
`hrl rollout`); without `placement.address` hrl starts a local Ray of its own, never the dead one RAY_ADDRESS or Ray's
address file names; and SIGTERM while Ray starts or runs ends `hrl rollout` within seconds, no Ray process left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrl.cli.errors import hint_for
from hrl.config import PlacementConfig
from hrl.runners.errors import PrerequisiteError
from hrl.runners.placement.ray_cluster import _descendants, _state, init_ray

pytestmark = pytest.mark.timeout(120)
SLACK_S = 2.0  # past the deadline, on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session(sid: int) -> dict[int, str]:
    """The live processes of session `sid` (Ray's workers take process groups of their own, never a new session)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            out[int(stat.parent.name)] = cmd[:120]
    return out


def test_an_address_nobody_answers_is_an_error_within_the_deadline():
    import ray

    address = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(PrerequisiteError) as caught:
        init_ray(ray, PlacementConfig(kind="ray", address=address, connect_timeout_s=3))
    took = time.monotonic() - started
    print(f"\nan address nobody listens on: the error after {took:.2f} s (connect_timeout_s=3)")
    assert 2.5 <= took <= 3 + SLACK_S
    assert f"no Ray cluster answered at {address} within 3 s" in str(caught.value)
    assert "Connection refused" in str(caught.value)
    code, hint = hint_for(caught.value)
    assert code == 4 and "placement.connect_timeout_s" in hint and "ray start" in hint
    assert not ray.is_initialized()


JOIN_SILENT = """
import json, socket, sys, time
import ray
from hrl.config import PlacementConfig
from hrl.runners.errors import PrerequisiteError
from hrl.runners.placement.ray_cluster import _descendants, _state, init_ray

listener = socket.create_server(("127.0.0.1", 0))  # accepts every connection (the kernel does) and never answers
address = f"127.0.0.1:{listener.getsockname()[1]}"
started = time.monotonic()
try:
    init_ray(ray, PlacementConfig(kind="ray", address=address, connect_timeout_s=3))
    error = None
except PrerequisiteError as e:
    error = str(e)
print(json.dumps({"address": address, "took": time.monotonic() - started, "error": error}), flush=True)
"""


def test_an_address_that_accepts_and_never_answers_is_an_error_within_the_deadline():
    """Past the TCP probe, Ray's own join (minutes of C++ retries) is cut at the deadline: in a process of its own,
    whose join thread is left behind when it exits."""
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", JOIN_SILENT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    print(f"\na silent listener: the error after {got['took']:.2f} s (connect_timeout_s=3), the process gone after "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    assert got["error"] is not None and 3 <= got["took"] <= 3 + SLACK_S
    assert f"no Ray cluster answered at {got['address']} within 3 s: Ray did not finish joining" in got["error"]
    assert "SIGTERM handler is not set" not in r.stderr  # Ray's warning for a join off the main thread


@pytest.fixture
def ray_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Ray temp folder of the test's own (RAY_TMPDIR): the address file a cluster writes there misleads no other
    `ray.init()` on this machine. Short: Ray's socket paths under it have a length limit."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


def test_a_dead_address_in_ray_address_and_the_address_file_starts_a_local_cluster(ray_tmp, monkeypatch):
    import ray

    assert not ray.is_initialized()
    dead = f"127.0.0.1:{_free_port()}"
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text(dead)  # what a cluster that died leaves behind
    monkeypatch.setenv("RAY_ADDRESS", dead)
    said: list[str] = []
    before = _descendants()
    started = time.monotonic()
    try:
        assert init_ray(ray, PlacementConfig(kind="ray", num_cpus=1), said.append) is True
        took = time.monotonic() - started
        assert ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] != dead.rsplit(":", 1)[1]
        assert ray.cluster_resources().get("CPU") == 1
        assert init_ray(ray, PlacementConfig(kind="ray", address=dead)) is False  # already up: nothing done
        ours = _descendants() - before
    finally:
        ray.shutdown()
    print(f"\na local Ray started in {took:.1f} s despite RAY_ADDRESS and the address file naming {dead}")
    assert said == [f"RAY_ADDRESS={dead} ignored: without placement.address hrl starts a local Ray of its own"]
    deadline = time.monotonic() + 15
    while (left := {p for p in ours if _state(p) not in "ZX"}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes left after shutdown: {sorted(left)}"


def _one(x: int) -> int:
    return x + 1


def test_an_address_that_answers_is_joined_and_used_from_this_thread(ray_tmp):
    """The join runs on a helper thread; the driver it makes serves this one (tasks, shutdown) as ever."""
    import ray
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    before = _descendants()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    address = cluster.address
    try:
        started = time.monotonic()
        assert init_ray(ray, PlacementConfig(kind="ray", address=address, connect_timeout_s=30)) is False
        took = time.monotonic() - started
        assert ray.get(ray.remote(_one).remote(1), timeout=60) == 2
        ours = _descendants() - before
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\njoined {address} in {took:.2f} s")
    deadline = time.monotonic() + 15
    while (left := {p for p in ours if _state(p) not in "ZX"}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes left after shutdown: {sorted(left)}"


def _rollout(tmp_path: Path, *config: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`hrl rollout --recipe demo --placement ray` of one episode (the scripted engine: no model loads), in a session
    of its own, stderr piped."""
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--recipe", "demo", "--placement", "ray", "--engine", "scripted",
           "-n", "1", "--limit", "1", "--out", str(tmp_path / "out.jsonl"), "-c", "placement.num_cpus=1",
           *(a for c in config for a in ("-c", c))]  # fmt: skip
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})})  # fmt: skip


def test_hrl_rollout_exits_4_naming_an_address_nobody_answers(tmp_path):
    port = _free_port()
    p = _rollout(tmp_path, f"placement.address=127.0.0.1:{port}", "placement.connect_timeout_s=3")
    _, err = p.communicate(timeout=90)
    assert p.returncode == 4, err[-3000:]
    assert f"Error: no Ray cluster answered at 127.0.0.1:{port} within 3 s" in err
    assert "Hint: start the cluster (`ray start --head --port=6379`), check placement.address, or raise " in err


@pytest.mark.parametrize(
    ("join", "after", "wait_s", "budget_s"),
    [
        (False, "ignored: without placement.address", 1.0, 10),  # Ray starting (said just before ray.init)
        (False, "ignored: without placement.address", 4.0, 10),  # later in its start: processes up, driver connecting
        (True, "1 episodes (1 tasks", 3.0, 10),  # joining an address that accepts and never answers (deadline 60 s)
        pytest.param(False, "engine replica(s) on Ray", 1.0, 25, marks=pytest.mark.slow),  # Ray running, the
        # replica starting: ray.py's `_stop` waits for the replica's stop, queued behind its start (5-14 s measured)
    ],
    ids=["ray-starting", "ray-starting-later", "ray-joining", "ray-running"],
)
def test_sigterm_ends_hrl_rollout_promptly_and_leaves_no_ray_process(tmp_path, join, after, wait_s, budget_s):
    with socket.create_server(("127.0.0.1", 0)) as silent:
        config = [f"placement.address=127.0.0.1:{silent.getsockname()[1]}", "placement.connect_timeout_s=60"]
        p = _rollout(tmp_path, *(config if join else []), env={"RAY_ADDRESS": f"127.0.0.1:{_free_port()}"})
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(p.stderr or []), daemon=True).start()
        deadline = time.monotonic() + 90
        while not any(after in line for line in lines):
            assert p.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.05)
        time.sleep(wait_s)
        ours = _session(p.pid)
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        took = time.monotonic() - sent
    deadline = time.monotonic() + 10
    while (left := _session(p.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"\nSIGTERM {wait_s:g} s after {after!r}: exit {rc} after {took:.2f} s; {len(ours)} processes of the run "
          f"then, {len(left)} left")  # fmt: skip
    assert rc == 130, "".join(lines)[-3000:]
    assert took <= budget_s, f"SIGTERM took {took:.1f} s"
    assert not left, f"processes of the run left: {left}"
