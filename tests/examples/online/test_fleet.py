"""examples/online/fleet.py: an episode runs the fleet's agent in a local sandbox (an allowlist of the host's
variables, a HOME of its own), grades what it left in another, and posts the reward to the run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[3]
SECRET = "HRL_TEST_FLEET_SECRET"


def _fleet() -> Any:
    spec = importlib.util.spec_from_file_location("fleet", ROOT / "examples" / "online" / "fleet.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture
def fake_mini() -> Iterator[Path]:
    """A stand-in for the `mini` CLI, outside the temp folder (a local sandbox sees its own there): it fixes the demo
    task only where it runs with the session's key and none of the host's secrets or its HOME."""
    folder = Path.home() / ".cache" / f"hrl-test-fleet-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    script = folder / "mini"
    script.write_text(
        "#!/bin/sh\n"
        f'[ -z "${SECRET}" ] && [ "$HOME" != {Path.home()} ] && [ "${{OPENAI_API_KEY#hrl-}}" = tok-1 ] || exit 3\n'
        "sed -i 's/p and q/p or q/' rules.py\n"
    )
    script.chmod(0o755)
    try:
        yield script
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def run_url() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The run's client routes, recording what the fleet posts."""
    posted: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"] or 0))
            posted.append({"path": self.path, **json.loads(body or b"{}")})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posted
    finally:
        server.shutdown()


def test_an_episode_runs_the_agent_in_a_sandbox_without_the_hosts_secrets(
    fake_mini: Path, run_url: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET, "s3cr3t-" + uuid.uuid4().hex)
    url, posted = run_url
    task = next(t for t in load_tasks(ROOT / "recipes" / "demo" / "tasks.jsonl") if "p and q" in str(t.repo_snapshot))
    args = argparse.Namespace(url=url, key="hrlc-test", mini=str(fake_mini), step_limit=1, timeout_s=60, late_s=0)
    session = {"token": "tok-1", "base_url": f"{url}/s/tok-1"}
    reward = _fleet().episode(args, task.model_dump(), session, "tiny", False)
    assert reward == 1.0  # the stand-in fixed the task: it ran with the session's key, without the secret
    assert posted == [{"path": "/s/tok-1/end", "reward": 1.0, "info": {"graded_by": "fleet"}}]
