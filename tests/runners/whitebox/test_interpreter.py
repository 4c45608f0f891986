"""`rollout.python`: a white-box agent in a Python of its own (an agent library's pinned venv), with hrl's package
importable there and none of hrl's environment."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.errors import PrerequisiteError, UsageError
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import serving
from hrl.runners.whitebox.harness import resolve_mode
from hrl.runners.whitebox.interpreter import agent_python, check_python, client_root
from tests.conftest import install_agent

TASK = {"instance_id": "a1", "problem_statement": "What is 2+2?", "FAIL_TO_PASS": []}
AGENT = """import sys

async def run(task, session):
    import browser_use  # the venv's own library, which hrl's environment does not have
    try:
        import torch  # hrl's environment: not there
        leaked = True
    except ImportError:
        leaked = False
    reply = await session.openai(max_retries=0).chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}])
    session.reward(0.0 if leaked else 1.0, {"python": sys.executable, "said": reply.choices[0].message.content,
                                            "task": type(task).__name__})
"""


def test_the_python_is_hrls_a_path_or_an_installed_agent_and_bad_ones_are_refused(tmp_path):
    own = agent_python("")
    assert own.own and own.python == sys.executable and agent_python(sys.executable).own
    with pytest.raises(UsageError, match="no executable Python"):
        agent_python(str(tmp_path / "missing" / "python"))
    with pytest.raises(UsageError, match="agent CLI, not a Python agent"):
        agent_python("codex")
    with pytest.raises(UsageError, match=r"rollout\.mode: inprocess cannot"):
        resolve_mode("inprocess", "agent.py:run", None, "browser-use")
    assert resolve_mode("auto", "agent.py:run", {"name": "miniwob"}, "browser-use")[0] == "subprocess"
    assert (client_root() / "hrl" / "__init__.py").resolve() == Path(__import__("hrl").__file__).resolve()


def test_a_python_without_what_hrls_worker_needs_is_refused_before_any_episode(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    (tmp_path / "agent.py").write_text("async def run(task, session):\n    return 1.0\n")
    bare = agent_python(str(tmp_path / "bare" / "bin" / "python"))
    assert not bare.own and bare.paths[0] == str(client_root())
    with pytest.raises(PrerequisiteError, match="No module named 'pydantic'") as e:
        check_python(bare, "agent.py:run", str(tmp_path))
    assert "pydantic" in (e.value.hint or "") and "aiohttp" in (e.value.hint or "")


@pytest.mark.agents
@pytest.mark.timeout(600)
def test_an_agent_runs_in_its_libraries_venv_with_hrls_session(tiny_model, tmp_path):
    """browser-use's venv: the agent imports the library, not torch; its call is recorded through its session, and
    its reward (no verifier) is the episode's."""
    install_agent("browser-use", "local")
    (tmp_path / "agent.py").write_text(AGENT)

    async def main() -> dict:
        async with serving(tiny_model, "scripted", engine_options={"turns": ["4"]},
                           control_token=secrets.token_urlsafe(32)) as stack:  # fmt: skip
            config = RolloutConfig(agent="agent.py:run", python="browser-use")
            rollouts = make_rollouts(stack, config, verifier={"name": "python"}, base_dir=str(tmp_path))
            rollouts.prepare()
            return await rollouts.episode(Episode(TASK, 0, 0), tmp_path / "traces.jsonl")

    trace = asyncio.run(main())
    assert trace["failure_reason"] is None, trace["metadata"]
    info = trace["reward_info"]
    assert trace["reward"] == 1.0, info
    assert "browser-use" in info["python"] and info["python"] != sys.executable
    assert (info["said"], info["task"]) == ("4", "Task") and len(trace["calls"]) == 1
    assert trace["agent"]["version"] == "subprocess"
