"""Agent runners: the registry, the config each CLI gets, the lifecycle (HOME, budget, exit classification), the
install cache, and every CLI for real — installed pinned, run in a sandbox against the scripted engine through the
real recording proxy, leaving a file behind and a token-exact trace."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hrl.runners.agents import AGENTS, get_agent
from hrl.runners.agents.base import AgentContext, AgentRunner
from hrl.runners.agents.install import AgentInstall, _once, _steps, installed
from hrl.runners.agents.run import classify, run_agent
from hrl.runners.doctor.agents import (
    PROBE_FILE,
    PROBE_IMAGE,
    PROBE_TEXT,
    Probe,
    agents_table,
    doctor,
    image_problems,
    image_turns,
    probe_agent,
    probe_png,
    trace_problems,
)
from hrl.runners.errors import PrerequisiteError, UnknownNameError
from hrl.runners.trace import call_prompt_ids
from hrl.sandboxes import SandboxSpec
from hrl.sandboxes.local import LocalBackend
from tests.conftest import install_agent

# Measured per CLI: dialect, whether it streams, its shell tool (None: aider edits in text), side calls per episode.
EXPECTED: dict[str, tuple[str, bool, str | None, int]] = {
    "opencode": ("chat", True, "bash", 1),  # the title-generation call
    "codex": ("responses", True, "exec_command", 0),
    "claude-code": ("anthropic", True, "Bash", 0),
    "qwen-code": ("chat", True, "run_shell_command", 0),
    "gemini-cli": ("gemini", True, "run_shell_command", 0),
    "mini-swe-agent": ("chat", False, "bash", 0),
    "aider": ("chat", True, None, 0),
    "browser-use": ("chat", False, None, 0),  # a browser agent: browser tasks only (test_browser_agents.py)
}
SMOKE = [n for n in EXPECTED if not get_agent(n).drives_browser]  # they write the probe file
CTX = AgentContext(
    base_url="http://127.0.0.1:8000/s/tok",
    api_key="hrl-tok",
    model="m",
    prompt="--fix it",  # tasks may start with a dash: it must not read as an option
    home="/tmp/hrl-home-test",
    workdir="/work",
    install_dir="/opt/hrl/agents/x",
)


# ---- registry and per-agent config ------------------------------------------------------------------------------


def test_registry_lists_eight_agents_and_rejects_unknown_names():
    assert set(AGENTS) == set(EXPECTED)
    with pytest.raises(UnknownNameError) as info:
        get_agent("cursor")
    assert "cursor" in str(info.value) and all(name in str(info.value) for name in AGENTS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_runner_is_pinned_data_pointing_at_the_session(name):
    runner = get_agent(name)
    assert runner.name == name and runner.dialect == EXPECTED[name][0]
    assert runner.package_kind in ("npm", "pypi") and runner.version[0].isdigit()
    cmd, env, files = runner.command(CTX), runner.env(CTX), runner.files(CTX)
    assert cmd[0] == runner.bin and not runner.needs_tty
    assert any(arg == CTX.prompt or arg.endswith(f"={CTX.prompt}") for arg in cmd)
    wired = json.dumps([cmd, env, files])
    assert CTX.api_key in wired and "127.0.0.1:8000/s/tok" in wired
    for host in ("api.openai.com", "api.anthropic.com", "googleapis.com", "openrouter"):
        assert host not in wired
    for path, text in files.items():
        if path.endswith(".json"):
            json.loads(text)
        if path.endswith(".toml"):
            tomllib.loads(text)
    assert runner.smoke_turns("f.txt", "ok")


def test_codex_config_keeps_top_level_keys_out_of_tables():
    config = tomllib.loads(get_agent("codex").files(CTX)[".codex/config.toml"])
    assert config["model_provider"] == "hrl" and config["web_search"] == "disabled"  # not swallowed by a table
    provider = config["model_providers"]["hrl"]
    assert provider["base_url"] == "http://127.0.0.1:8000/s/tok/v1" and provider["wire_api"] == "responses"
    assert config["analytics"]["enabled"] is False and config["features"]["plugins"] is False


def test_agents_table_has_one_row_per_agent():
    rows = agents_table()
    assert [r["name"] for r in rows] == list(AGENTS)
    assert all({"version", "package", "dialect", "installed_docker", "installed_local"} <= set(r) for r in rows)


# ---- install cache ----------------------------------------------------------------------------------------------


def test_install_is_idempotent_and_rebuilds_on_a_new_recipe(tmp_path):
    dest, builds = tmp_path / "x-1", []

    def build(d: Path, log: Path) -> None:
        builds.append(d)
        (d / "bin").mkdir()

    _once(dest, "npm x@1", lambda _m: None, build)
    _once(dest, "npm x@1", lambda _m: None, build)
    assert len(builds) == 1 and (dest / "bin").is_dir()
    _once(dest, "npm x@1 (install scripts)", lambda _m: None, build)
    assert len(builds) == 2

    def broken(d: Path, log: Path) -> None:
        (d / "half").write_text("x")
        raise PrerequisiteError("boom", hint="retry")

    with pytest.raises(PrerequisiteError):
        _once(tmp_path / "y-1", "pip y==1", lambda _m: None, broken)
    assert not (tmp_path / "y-1").exists()


def test_installed_layout_mounts_the_cli_and_node_read_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HRL_CACHE", str(tmp_path))
    assert installed("codex", "docker") is None
    for dest, recipe, _ in _steps(get_agent("codex"), "docker", 0):
        _once(dest, recipe, lambda _m: None, lambda d, log: None)
    inst = installed("codex", "docker")
    assert inst is not None and inst.install_dir == "/opt/hrl/agents/codex"
    assert inst.path == ("/opt/hrl/agents/codex/node_modules/.bin", "/opt/hrl/node/bin")
    assert {m.target for m in inst.mounts} == {"/opt/hrl/agents/codex", "/opt/hrl/node"}
    assert all(m.read_only and m.source.startswith(str(tmp_path)) for m in inst.mounts)
    assert installed("mini-swe-agent", "local") is None  # python CLIs need a venv per target


def test_doctor_reports_a_missing_install_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HRL_CACHE", str(tmp_path))
    assert doctor(None, "unused-model", "docker") == []  # nothing installed: nothing to check
    (check,) = doctor(["codex"], "unused-model", "docker")
    assert not check.ok and "not installed" in check.reason and "hrl agents install codex" in check.reason
    with pytest.raises(UnknownNameError):
        doctor(["nope"], "unused-model")


# ---- lifecycle ----------------------------------------------------------------------------------------------------


@dataclass
class ShellRunner(AgentRunner):
    """A fake CLI: a shell snippet, with a config file and an env var to prove both arrive."""

    script: str
    needs_tty: bool = False
    name: str = "fake"
    version: str = "0"
    package_kind: str = "npm"
    package: str = "fake"
    bin: str = "sh"
    install_scripts: bool = False
    dialect: str = "chat"

    def files(self, ctx: AgentContext) -> dict[str, str]:
        return {".config/fake/cfg.json": json.dumps({"key": ctx.api_key})}

    def env(self, ctx: AgentContext) -> dict[str, str]:
        return {"FAKE_BASE": ctx.base_url}

    def command(self, ctx: AgentContext) -> list[str]:
        return ["sh", "-c", self.script]

    def smoke_turns(self, path: str, text: str) -> list[Any]:
        return []


LOCAL = AgentInstall("fake", "0", "local", "/nonexistent", (), (), "/nonexistent")


async def _run_fake(tmp_path: Path, runner: ShellRunner, budget: float = 30) -> tuple[Any, str]:
    home = f"/tmp/hrl-home-fake-{tmp_path.name}"  # a sandbox path, as new_home() gives (local: under its own tmp)
    ctx = AgentContext("http://x/s/t", "hrl-t", "m", "p", home, "/work", "/nonexistent")
    async with await LocalBackend(root=str(tmp_path)).create(SandboxSpec(), "test-agents", "fake") as box:
        return await run_agent(box, runner, ctx, LOCAL, time_budget_s=budget), home


def test_lifecycle_writes_config_into_a_fresh_home_and_cleans_it_up(tmp_path):
    script = 'cat "$XDG_CONFIG_HOME/fake/cfg.json"; echo " $FAKE_BASE $HOME"; pwd; cat; echo read-stdin'
    outcome, home = asyncio.run(_run_fake(tmp_path, ShellRunner(script)))
    assert outcome.ok and outcome.exit_code == 0, outcome
    lines = outcome.stdout_tail.splitlines()
    assert lines[0].startswith('{"key": "hrl-t"} http://x/s/t /') and lines[0].endswith(home), lines[0]
    assert lines[1].endswith("/work") and lines[2] == "read-stdin"  # ran in the workdir; stdin was closed
    assert not Path(home).exists()


@pytest.mark.parametrize(
    ("script", "budget", "reason", "code"),
    [  # a budget of 30 s where the script ends at once (a loaded machine may take a second to start it)
        ("echo bye >&2; exit 3", 30, "agent_exit", {3}),
        ("kill -9 $$", 30, "agent_crash", {-9, 137}),
        ("sleep 60", 2, "agent_timeout", {-1}),
    ],
)
def test_lifecycle_classifies_how_the_cli_ended(tmp_path, script, budget, reason, code):
    outcome, _ = asyncio.run(_run_fake(tmp_path, ShellRunner(script), budget=budget))
    assert outcome.failure_reason == reason and outcome.exit_code in code, outcome
    assert outcome.duration_s < 30  # the sleep: half its 60 s, so the 2 s budget cut it (15× that budget)
    if reason == "agent_exit":
        assert outcome.stderr_tail == "bye\n"


def test_a_cancelled_agent_runs_no_more_commands_in_its_sandbox(tmp_path):
    """A stop cancels the running agents: each sandbox is closed whole next, HOME with it, so no command runs after
    the cancel (tidying HOME in every sandbox first only delayed the stop)."""
    ctx = AgentContext("http://x/s/t", "hrl-t", "m", "p", "/tmp/hrl-home-cancel", "/work", "/nonexistent")

    async def main() -> list[Any]:
        async with await LocalBackend(root=str(tmp_path)).create(SandboxSpec(), "test-agents", "fake") as box:
            ran, real, started = [], box.exec, asyncio.Event()

            async def spy(cmd: Any, **kw: Any) -> Any:
                ran.append(cmd)
                if len(ran) == 2:  # HOME made, the agent started
                    started.set()
                return await real(cmd, **kw)

            box.exec = spy  # type: ignore[method-assign]
            agent = asyncio.create_task(run_agent(box, ShellRunner("sleep 60"), ctx, LOCAL, time_budget_s=120))
            await asyncio.wait_for(started.wait(), 60)
            await asyncio.sleep(0.3)
            agent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await agent
            return ran

    ran = asyncio.run(main())
    assert len(ran) == 2 and ran[1][-1] == "sleep 60", ran


def test_classify_reads_shell_signal_codes_as_crashes():
    assert classify(0, False) is None
    assert classify(137, False) == classify(-11, False) == "agent_crash"
    assert classify(1, False) == classify(255, False) == "agent_exit"
    assert classify(-1, True) == "agent_timeout"


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script`")
def test_needs_tty_gives_the_cli_a_terminal(tmp_path):
    outcome, _ = asyncio.run(_run_fake(tmp_path, ShellRunner("test -t 1 && echo on-a-tty", needs_tty=True)))
    assert outcome.ok and "on-a-tty" in outcome.stdout_tail, outcome


# ---- every CLI, for real ----------------------------------------------------------------------------------------


# A task that starts with dashes, as a problem statement can: every CLI must take it as the task, not an option.
DASH_TASK = f"--- task ---\nWrite the word {PROBE_TEXT} into the file {PROBE_FILE}."


# the CLIs that export OpenTelemetry, and the event that reports their tool call (runners/proxy/otel_in.py)
OTEL_EVENTS = {
    "codex": "codex.tool_result",
    "claude-code": "claude_code.tool_result",
    "gemini-cli": "gemini_cli.tool_call",
}


def _check_episode(name: str, probe: Probe, node: Any, model: str) -> None:
    from transformers import AutoTokenizer

    dialect, stream, tool, n_side = EXPECTED[name]
    out, trace = probe.outcome, probe.trace
    node.user_properties += [("startup_s", probe.startup_s), ("agent_s", probe.outcome.duration_s)]
    assert out.ok and out.exit_code == 0, f"{out.failure_reason} {out.exit_code}\n{out.stdout_tail}\n{out.stderr_tail}"
    assert probe.file_text == f"{PROBE_TEXT}\n"
    calls = trace["calls"]
    main = [i for i, c in enumerate(calls) if not c["side"]]
    assert len(main) == 2 and len(calls) - len(main) == n_side, [(c["side"], c["finish_reason"]) for c in calls]
    assert {(c["dialect"], c["stream"]) for c in calls} == {(dialect, stream)}
    if tool is not None:
        assert calls[main[0]]["finish_reason"] == "tool_calls"
        assert [t["name"] for t in trace["tools"]] == [tool]
        assert trace["tools"][0]["ended_at"] >= trace["tools"][0]["started_at"]
    if name in OTEL_EVENTS:  # the CLI's own telemetry reached the session: its tool event replaced the inferred one
        event = trace["tools"][0]
        assert (event["source"], event["status"], event["decision"]) == ("otel", "ok", "accept"), event
        assert trace["metadata"]["telemetry_events"].get(OTEL_EVENTS[name]) == 1, trace["metadata"]["telemetry_events"]
    first, second = main
    prev = call_prompt_ids(trace, first) + calls[first]["response_ids"]
    assert call_prompt_ids(trace, second)[: len(prev)] == prev  # token-exact: sampled ids reused verbatim
    assert calls[second]["prompt_ref"] == {"call_id": calls[first]["call_id"], "length": len(prev)}
    assert trace_problems(trace, dialect) == []
    assert DASH_TASK in AutoTokenizer.from_pretrained(model).decode(call_prompt_ids(trace, first))


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.timeout(1800)  # a first install of a Python CLI takes minutes
@pytest.mark.parametrize("name", SMOKE)
def test_cli_runs_in_docker_through_the_proxy(name, tiny_model, request):
    install_agent(name, "docker")
    probe = asyncio.run(probe_agent(name, tiny_model, "docker", time_budget_s=300, prompt=DASH_TASK))
    _check_episode(name, probe, request.node, tiny_model)


@pytest.mark.agents
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["qwen-code", "mini-swe-agent"])  # one npm and one Python CLI
def test_cli_runs_in_local_sandbox_through_the_proxy(name, tiny_model, request):
    install_agent(name, "local")
    probe = asyncio.run(probe_agent(name, tiny_model, "local", time_budget_s=300, prompt=DASH_TASK))
    _check_episode(name, probe, request.node, tiny_model)


# ---- images through the CLIs' own tools -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from hrl.train.tiny import build_tiny_vision_model

    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", [n for n in EXPECTED if get_agent(n).image_tool is not None])
def test_cli_shows_the_model_an_image_its_own_tool_read(name, vision_model, tmp_path):
    """Claude Code's Read, Codex's view_image, Gemini CLI's and Qwen Code's read_file, opencode's read, in Docker
    through the proxy to the tiny vision model: the PNG the CLI wrote reaches the engine as the file's bytes, the
    call records it expanded by the model's own processor at its placeholder, the run's media folder keeps it, and
    the training sample carries it and makes its pixels."""
    from transformers import AutoProcessor

    from hrl.train.media import Pixels
    from hrl.train.samples import build_samples

    install_agent(name, "docker")
    png, media = probe_png(), tmp_path / "media"
    turns = image_turns(name, png)
    probe = asyncio.run(probe_agent(name, vision_model, "docker", time_budget_s=300, turns=turns,
                                    prompt=f"Look at {PROBE_IMAGE}.", media_dir=str(media)))  # fmt: skip
    out, trace = probe.outcome, probe.trace
    assert out.ok, f"{out.failure_reason} {out.exit_code}\n{out.stdout_tail}\n{out.stderr_tail}"
    dialect, _stream, shell, _side = EXPECTED[name]
    assert [t["name"] for t in trace["tools"]] == [shell, get_agent(name).image_tool[0]]  # type: ignore[index]
    main = [i for i, c in enumerate(trace["calls"]) if not c["side"]]
    assert len(main) == 3 and trace_problems(trace, dialect) == []
    assert [trace["calls"][i].get("media") or [] for i in main[:2]] == [[], []]
    (m,) = trace["calls"][main[2]]["media"]
    sha = hashlib.sha256(png).hexdigest()
    assert (m["sha256"], m["mime"], m["bytes"], m["width"], m["height"]) == (sha, "image/png", len(png), 40, 28)
    processor = AutoProcessor.from_pretrained(vision_model)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    run = processor(text=processor.image_token, images=[[image]], add_special_tokens=False)["input_ids"][0]
    offset, length = m["placeholder"]
    assert call_prompt_ids(trace, main[2])[offset : offset + length] == [int(t) for t in run]  # token-exact
    assert (media / sha).read_bytes() == png  # stored once, content-addressed
    (sample,) = [s for s in build_samples(trace, media_dir=media) if s.media]
    assert sample.media == [m]
    assert Pixels(vision_model).of(sample)["pixel_values"].shape[:2] == (1, 1)  # one image, one view
    assert image_problems(trace, png, vision_model, str(media)) == []
    other = probe_png()[:-12] + b"\x00" * 12  # another file's bytes: the probe says the image is not the file's
    assert "expected the file's" in image_problems(trace, other, vision_model, str(media))[0]


def test_each_mcp_client_configures_the_servers_it_is_given_and_the_others_are_refused():
    """A CLI with an MCP client names the server's argv in its own settings (claude-code: a file its command points
    at); without servers none of that appears; aider and mini-swe-agent have no client (`mcp_tool` None)."""
    import dataclasses

    argv = ["/opt/hrl/node/bin/node", "/opt/hrl/mcp/playwright/cli.js", "--cdp-endpoint", "http://127.0.0.1:9222"]
    with_mcp = dataclasses.replace(CTX, mcp={"playwright": argv})
    for name in AGENTS:
        runner = get_agent(name)
        plain = json.dumps([runner.files(CTX), runner.command(CTX)])
        assert "cdp-endpoint" not in plain and "playwright" not in plain
        if runner.mcp_tool is None:
            assert name in ("aider", "mini-swe-agent", "browser-use")
            continue
        configured = json.dumps([runner.files(with_mcp), runner.command(with_mcp)])
        assert all(json.dumps(a)[1:-1] in configured for a in argv), name
        assert "{server}" in runner.mcp_tool and "{tool}" in runner.mcp_tool
    codex = tomllib.loads(get_agent("codex").files(with_mcp)[".codex/config.toml"])["mcp_servers"]["playwright"]
    assert (codex["command"], codex["args"], codex["required"]) == (argv[0], argv[1:], True)
    claude = get_agent("claude-code").command(with_mcp)
    assert claude[claude.index("--mcp-config") + 1] == f"{CTX.home}/.hrl-mcp.json" and "--strict-mcp-config" in claude
