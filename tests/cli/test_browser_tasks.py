"""`miniwob:` task sources on the command line: an agent that could not reach the episode's browser is refused before
anything starts, never scored 0."""

from __future__ import annotations

import pytest

from tests.cli.test_error_policy import USAGE, run_hrl

pytestmark = pytest.mark.browser


def test_an_agent_that_cannot_reach_the_browser_is_refused(tmp_path, monkeypatch, capsys):
    argv = ["--agent", "mini-swe-agent", "--model", "hrl:tiny", "--sandbox", "local", "--tasks", "miniwob:click-test"]
    code, _, err = run_hrl(["rollout", *argv, "--out", str(tmp_path / "t.jsonl")], {}, monkeypatch, capsys)
    assert code == USAGE
    assert "MiniWoB++ tasks cannot run" in err and "with mini-swe-agent:" in err and "Hint:" in err
    assert not (tmp_path / "t.jsonl").exists()


def test_an_agent_in_its_own_python_cannot_run_in_process(tmp_path, monkeypatch, capsys):
    """rollout.python runs the agent in another interpreter: in process is refused before anything is installed."""
    argv = ["--recipe", "browser", "-c", "rollout.python=browser-use", "-c", "rollout.mode=inprocess"]
    code, _, err = run_hrl(["rollout", *argv, "--out", str(tmp_path / "t.jsonl")], {}, monkeypatch, capsys)
    assert code == USAGE
    assert "rollout.mode: inprocess cannot" in err and "Hint: set rollout.mode: subprocess" in err
    assert not (tmp_path / "t.jsonl").exists()
