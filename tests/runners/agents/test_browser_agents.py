"""Agent CLIs on browser tasks: `hrl rollout --recipe browser --agent CLI --sandbox docker --limit 2`, each CLI given
the Playwright MCP server through its own MCP settings and connected to the episode's browser (forwarded into the
container from a socket of the episode's own), the scripted engine calling the CLI's MCP tools by the names the CLI
gives them. Per episode: one trace, the page's own reward 1, the MCP calls in `hrl inspect`; after the run no
container, browser or socket folder is left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hrl.runners.agents import get_agent
from tests.conftest import covering, install_agent

MCP_CLIS = ["claude-code", "codex", "opencode", "gemini-cli", "qwen-code"]


def hrl(*args: str, cwd: Path, timeout: float = 600, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", **({"TMPDIR": str(tmp)} if tmp else {})}
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def browser_turns(name: str) -> list[object]:
    """Snapshot the page, click its button by the snapshot's ref, finish: in the CLI's own MCP tool names (Qwen Code's
    first prompt already holds one assistant turn, as its smoke script says)."""
    runner = get_agent(name)
    tool = runner.mcp_tool.format(server="playwright", tool="{}")  # type: ignore[union-attr]
    turns: list[object] = [
        {"tool_calls": [{"name": tool.format("browser_snapshot"), "arguments": {}}]},
        {"tool_calls": [{"name": tool.format("browser_click"), "arguments": {"element": "Click Me!", "target": "e5"}}]},
        "Done.",
    ]
    pad = len(runner.smoke_turns("f", "t")) - 2
    return [turns[0]] * pad + turns


def running_under(folder: Path) -> list[int]:
    """Processes whose command line names `folder` (a browser's profile there)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(folder).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", MCP_CLIS)
def test_a_cli_drives_the_episodes_browser_through_its_mcp_server(name: str, tmp_path: Path):
    install_agent(name, "docker")
    tmp = Path(
        tempfile.mkdtemp(prefix="hrl-t-", dir="/tmp")
    )  # the run's profiles and sockets (short: unix socket paths)
    run_id = f"hrl-browser-{name}"
    run = hrl("rollout", "--recipe", "browser", "--agent", name, "--sandbox", "docker", "--limit", "2",
              "--engine", "scripted", "-c", f"engine_options.turns={json.dumps(browser_turns(name))}",
              "-c", "engine_options.max_model_len=1048576", "-c", "proxy.default_max_tokens=512",
              "-c", "rollout.agent_options.context_tokens=200000", "--run-id", run_id,
              "--out", "traces.jsonl", cwd=tmp_path, tmp=tmp)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert sorted(t["task_id"] for t in traces) == ["miniwob.click-test.s0", "miniwob.click-test.s1"]
    for t in traces:
        assert (t["reward"], t["success"], t["failure_reason"]) == (1.0, True, None), t["metadata"].get(
            "agent_stdout_tail"
        )
        assert t["reward_info"]["ended"] and not t["reward_info"]["tampered"]
        assert t["reward_info"]["refused_commands"] == [] and t["reward_info"]["blocked_requests"] == []
    shown = hrl("inspect", "traces.jsonl", "--trace", traces[0]["trace_id"], cwd=tmp_path)
    click = get_agent(name).mcp_tool.format(server="playwright", tool="browser_click")  # type: ignore[union-attr]
    assert f"tool call {click} " in shown.stdout
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=hrl.run={run_id}"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert left.stdout.strip() == ""
    assert running_under(tmp) == []  # no browser, relay or MCP server left
    assert list(tmp.iterdir()) == []  # profiles and socket folders removed
    tmp.rmdir()


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from hrl.train.tiny import build_tiny_vision_model

    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.timeout(900)
# CI: claude-code here (the MCP server's screenshots as images); each CLI's own image to the model in test_agents.py
@pytest.mark.parametrize("name", covering(MCP_CLIS, full=["codex", "opencode", "gemini-cli", "qwen-code"]))
def test_a_screenshot_reaches_the_vision_model_as_media(name: str, vision_model: str, tmp_path: Path):
    """With a model that takes images, the MCP server sends its screenshots as images: the CLI passes the page's
    screenshot on, and the call after it records one PNG of the page, kept in the run's media folder."""
    install_agent(name, "docker")
    runner = get_agent(name)
    shot = {"name": runner.mcp_tool.format(server="playwright", tool="browser_take_screenshot"),  # type: ignore[union-attr]
            "arguments": {"type": "png", "scale": "css"}}  # fmt: skip
    turns = [{"tool_calls": [shot]}] * (len(runner.smoke_turns("f", "t")) - 1) + ["Done."]
    run = hrl("rollout", "--recipe", "browser", "--agent", name, "--sandbox", "docker", "--tasks",
              "miniwob:click-test", "--model", vision_model, "--engine", "scripted",
              "-c", f"engine_options.turns={json.dumps(turns)}", "-c", "engine_options.max_model_len=1048576",
              "-c", "proxy.default_max_tokens=512", "-c", "rollout.agent_options.context_tokens=200000",
              "--out", "traces.jsonl", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (trace,) = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    media = [m for c in trace["calls"] for m in c.get("media") or []]
    assert len(media) == 1 and media[0]["mime"] == "image/png", trace["metadata"].get("agent_stdout_tail")
    assert media[0]["width"] > 100 and media[0]["height"] > 100  # the page, not an icon
    assert (tmp_path / "media" / media[0]["sha256"]).is_file()
    assert not trace.get("dropped_media")


def _step(*actions: dict) -> str:
    """One browser-use step as its JSON-schema output: the goals it writes and its actions."""
    return json.dumps({"evaluation_previous_goal": "-", "memory": "-", "next_goal": "-", "action": list(actions)})


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_browser_use_drives_the_episodes_browser_with_its_own_agent_loop(tmp_path: Path):
    """browser-use, in its own venv in the sandbox, with its own Agent loop and prompts: it connects to the
    episode's browser through the forward, sees the page's button as one of its numbered elements and clicks it; the page's
    reward is 1 for both episodes and nothing is left behind. Each of its steps re-renders the whole prompt (its
    history is in the user message), so every call is a branch of its own."""
    install_agent("browser-use", "docker")
    tmp = Path(tempfile.mkdtemp(prefix="hrl-t-", dir="/tmp"))
    run_id = "hrl-browser-use"
    # browser-use numbers the page's elements anew per episode ([2] or [3] for this button): the turn takes the
    # number from the prompt; the scripted engine plays it at every step (browser-use sends no assistant turns)
    click = _step({"click": {"index": 0}})
    turns = [click.replace('"index": 0', '"index": {{match:\\[(\\d+)\\]<button id=subbtn||1}}')]
    run = hrl("rollout", "--recipe", "browser", "--agent", "browser-use", "--sandbox", "docker", "--limit", "2",
              "--engine", "scripted", "-c", f"engine_options.turns={json.dumps(turns)}",
              "-c", "engine_options.max_model_len=1048576", "-c", "proxy.default_max_tokens=512",
              "-c", "rollout.agent_options.max_steps=2", "--run-id", run_id, "--out", "traces.jsonl",
              cwd=tmp_path, tmp=tmp)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        assert (t["reward"], t["success"], t["failure_reason"]) == (1.0, True, None), t["metadata"].get(
            "agent_stderr_tail"
        )
        assert not t["reward_info"]["tampered"] and t["reward_info"]["refused_commands"] == []
        # two steps: the click, then its last step, where browser-use accepts only `done` (the script's click there
        # is refused by its own output check; the page's reward was already given)
        assert len(t["calls"]) == 2 and t["agent"]["name"] == "browser-use"
    shown = hrl("inspect", "traces.jsonl", "--full", "--trace", traces[0]["trace_id"], cwd=tmp_path).stdout
    index = re.search(r"\[(\d+)\]<button id=subbtn />", shown).group(1)  # type: ignore[union-attr]
    flat = re.sub(r"\s*\n[│ ]*", " ", shown)  # long lines are wrapped
    assert f'"action": [{{"click": {{"index": {index}}}}}]' in flat
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=hrl.run={run_id}"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert left.stdout.strip() == "" and running_under(tmp) == [] and list(tmp.iterdir()) == []
    tmp.rmdir()


@pytest.mark.agents
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_browser_use_runs_as_a_white_box_agent_in_its_own_venv(tmp_path: Path):
    """`--agent python:…browser_use_agent:run` with `rollout.python: browser-use`: hrl's worker runs in the library's
    own venv (hrl's package importable there, not hrl's environment), closed in a namespace where bubblewrap runs,
    with the episode's browser (`session.browser`) forwarded in. browser-use's own loop clicks the page's button by its
    number; each episode is one trace with the page's reward, and nothing is left behind."""
    install_agent("browser-use", "local")
    tmp = Path(tempfile.mkdtemp(prefix="hrl-t-", dir="/tmp"))
    agent = "python:hrl.runners.agents.browser_use_agent:run"
    click = _step({"click": {"index": 0}})
    turns = [click.replace('"index": 0', '"index": {{match:\\[(\\d+)\\]<button id=subbtn||1}}')]
    run = hrl("rollout", "--recipe", "browser", "--agent", agent, "--sandbox", "local",
              "--limit", "2", "--engine", "scripted", "-c", f"engine_options.turns={json.dumps(turns)}",
              "-c", "engine_options.max_model_len=1048576", "-c", "proxy.default_max_tokens=512",
              "-c", "rollout.python=browser-use", "-c", "rollout.agent_options.max_steps=2", "--out", "traces.jsonl",
              cwd=tmp_path, tmp=tmp)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "agent in a subprocess: in its own Python (rollout.python: browser-use)" in run.stderr
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        assert (t["reward"], t["success"], t["failure_reason"]) == (1.0, True, None), t["metadata"]
        assert not t["reward_info"]["tampered"] and t["reward_info"]["refused_commands"] == []
        assert t["agent"] == {"name": agent, "version": "subprocess"}
        assert len(t["calls"]) == 2  # max_steps (session.options): the click, then its last step (done only)
    shown = hrl("inspect", "traces.jsonl", "--full", "--trace", traces[0]["trace_id"], cwd=tmp_path).stdout
    index = re.search(r"\[(\d+)\]<button id=subbtn />", shown).group(1)  # type: ignore[union-attr]
    flat = re.sub(r"\s*\n[│ ]*", " ", shown)
    assert f'"action": [{{"click": {{"index": {index}}}}}]' in flat
    assert running_under(tmp) == [] and list(tmp.iterdir()) == []
    tmp.rmdir()
