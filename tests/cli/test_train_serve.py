"""`hrl train --serve` through the real CLI: the run serves on the port it prints, a client key (`hrl keys add`)
opens sessions and ends them with rewards over HTTP, the run trains a step on them and exits with a run directory
like any run's; a client key is refused the control routes; the control token stays in the run, 0600."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.rundir import RunDir

HRL = [sys.executable, "-m", "hrl.cli"]


def _post(url: str, key: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.agents  # the demo recipe's agent (mini-swe-agent) is checked before the run starts
@pytest.mark.timeout(300)
def test_train_serve_trains_on_a_clients_sessions(tiny_model: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    key = subprocess.run([*HRL, "keys", "add", "ci", "--run-dir", str(run)], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    log = (tmp_path / "train.log").open("w+")
    cmd = [*HRL, "train", "--recipe", "demo", "--model", tiny_model, "--serve", "--port", "0", "--run-dir", str(run),
           "-c", "eval_tasks=", "-c", "train.iterations=1", "-c", "async.batch_traces=2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = None
        for _ in range(600):
            found = re.search(r"serving clients at (http://\S+)", Path(log.name).read_text())
            if found or proc.poll() is not None:
                url = found and found.group(1)
                break
            time.sleep(0.2)
        assert url, Path(log.name).read_text()
        assert _post(url + "/pause", key)[0] == 403
        for reward in (1.0, 0.0):
            status, s = _post(url + "/sessions", key, {"task_id": "t"})
            assert status == 201, s
            chat = urllib.request.Request(s["base_url"] + "/chat/completions", method="POST",
                                          data=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 4}).encode(),
                                          headers={"Authorization": f"Bearer hrl-{s['token']}"})  # fmt: skip
            urllib.request.urlopen(chat, timeout=60).close()
            assert _post(f"{url}/s/{s['token']}/end", key, {"reward": reward})[1]["status"] == "final"
        assert proc.wait(timeout=240) == 0, Path(log.name).read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = Path(log.name).read_text()
    assert "each step waits for 2 final traces (async.batch_traces)" in out, out  # said at start
    assert re.search(r"step   0  v1 .* online open 0 pending 0", out), out
    rd = RunDir(run)
    assert rd.state()["iteration"] == 1 and rd.config()["online"]["enabled"] is True
    assert sorted(t["reward"] for t in rd.all_traces()) == [0.0, 1.0]
    assert (run / "control-token").stat().st_mode & 0o777 == 0o600
