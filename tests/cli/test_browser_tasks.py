"""`miniwob:` task sources on the command line: an agent that could not reach the episode's browser is refused before
anything starts, never scored 0."""

from __future__ import annotations

import pytest

from tests.cli.test_error_policy import USAGE, run_hrl

pytestmark = pytest.mark.browser


@pytest.mark.parametrize(
    ("argv", "who"),
    [(["--agent", "mini-swe-agent", "--model", "hrl:tiny", "--sandbox", "local", "--tasks", "miniwob:click-test"],
      "with mini-swe-agent:"),
     (["--recipe", "browser", "-c", "rollout.mode=subprocess"], "in a subprocess")],
)  # fmt: skip
def test_an_agent_that_cannot_reach_the_browser_is_refused(argv, who, tmp_path, monkeypatch, capsys):
    code, _, err = run_hrl(["rollout", *argv, "--out", str(tmp_path / "t.jsonl")], {}, monkeypatch, capsys)
    assert code == USAGE
    assert "MiniWoB++ tasks cannot run" in err and who in err and "Hint:" in err
    assert not (tmp_path / "t.jsonl").exists()
