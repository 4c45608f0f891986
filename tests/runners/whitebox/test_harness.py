"""`PythonRollouts`: a `python:` agent as a harness — loading, its outcomes as trace data, the sandbox it may ask
for — against the real proxy with the scripted engine."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from hrl.recipes.loader import load_recipe
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import serving
from hrl.runners.tasks.load import load_tasks
from hrl.runners.whitebox.harness import AgentLoadError, PythonRollouts, is_python_agent, load_function

DEMO_TASK = load_tasks(load_recipe("demo")["tasks"])[0]  # a one-bug repository with hidden tests
ARITH_TASK = {"instance_id": "a1", "problem_statement": "What is 2+2?", "FAIL_TO_PASS": [], "answer": "4"}


def _run(model: str, agent: Path, turns: list, tmp_path: Path, task=ARITH_TASK, verifier=None, **rollout) -> dict:
    async def main() -> dict:
        async with serving(model, "scripted", engine_options={"turns": turns},
                           control_token=secrets.token_urlsafe(32)) as stack:  # fmt: skip
            config = RolloutConfig(agent=f"{agent}:run", **rollout)
            rollouts = make_rollouts(stack, config, verifier=verifier or {"name": "python"})
            assert isinstance(rollouts, PythonRollouts)
            return await rollouts.episode(Episode(task, 0, 0), tmp_path / "traces.jsonl")

    return asyncio.run(main())


def _agent(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.py"
    path.write_text("import asyncio\n\nasync def run(task, session):\n" + body)
    return path


def test_specs_name_modules_or_files_and_bad_ones_say_how_to_write_them(tmp_path):
    assert is_python_agent("python:pkg.mod:run") and is_python_agent("a/b.py:run") and not is_python_agent("codex")
    assert load_function("python:json:dumps") is __import__("json").dumps
    (tmp_path / "mine.py").write_text("def go(task, session):\n    return 1.0\n")
    assert load_function("mine.py:go", base_dir=tmp_path)(None, None) == 1.0
    with pytest.raises(AgentLoadError, match="not MODULE:FUNCTION") as e:
        load_function("python:nofunction")
    assert "--agent python:" in (e.value.hint or "")
    with pytest.raises(AgentLoadError, match="no agent file"):
        load_function("missing.py:run", base_dir=tmp_path)
    with pytest.raises(AgentLoadError, match="has no function 'nope'"):
        load_function("mine.py:nope", base_dir=tmp_path)


def test_a_returned_reward_is_the_episodes(tiny_model, tmp_path):
    agent = _agent(tmp_path, "    out = await session.openai().chat.completions.create(model=session.model,\n"
                   "        messages=[{'role': 'user', 'content': task.problem_statement}])\n"
                   "    return 0.75\n")  # fmt: skip
    trace = _run(tiny_model, agent, ["4"], tmp_path)
    assert trace["reward"] == 0.75 and len(trace["calls"]) == 1 and trace["failure_reason"] is None


CALL = ("    await session.openai().chat.completions.create(model=session.model,\n"
        "        messages=[{'role': 'user', 'content': task.problem_statement}])\n")  # fmt: skip


def test_a_crash_and_a_timeout_are_the_policys_failures(tiny_model, tmp_path):
    crash = _run(tiny_model, _agent(tmp_path, CALL + "    raise ValueError('bad plan')\n"), ["4"], tmp_path)
    assert crash["failure_reason"] == "agent_crash" and "bad plan" in crash["metadata"]["error"]
    assert "ValueError" in crash["metadata"]["traceback"]
    slow = _run(tiny_model, _agent(tmp_path, CALL + "    await asyncio.sleep(30)\n"), ["4"], tmp_path, time_budget_s=5)
    assert slow["failure_reason"] == "agent_timeout" and slow["reward"] is None


def test_a_crash_before_the_first_call_is_the_harnesss(tiny_model, tmp_path):
    """Before its first model call an agent has done nothing the policy chose: no_llm_calls, a harness failure
    (never trained on), the crash and its words kept."""
    crash = _run(tiny_model, _agent(tmp_path, "    raise ValueError('bad plan')\n"), ["4"], tmp_path)
    assert crash["failure_reason"] == "no_llm_calls" and crash["reward"] is None
    assert crash["metadata"]["agent_failure"] == "agent_crash" and "bad plan" in crash["metadata"]["error"]


@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_tests_verifier_grades_what_the_agent_did_in_its_sandbox(tiny_model, tmp_path, sandbox, request):
    """The model's reply is a shell command; the agent runs it in `session.sandbox`; the hidden tests grade it."""
    if sandbox == "docker":
        request.getfixturevalue("swe_image")  # the grading image, built once
    agent = _agent(tmp_path, "    out = await session.openai().chat.completions.create(model=session.model,\n"
                   "        messages=[{'role': 'user', 'content': task.problem_statement}])\n"
                   "    await session.sandbox.exec(out.choices[0].message.content, timeout_s=30)\n")  # fmt: skip
    verifier = {"name": "tests", "timeout_s": 60}
    fixed = _run(tiny_model, agent, [DEMO_TASK.demo["fix"]], tmp_path, DEMO_TASK, verifier, sandbox=sandbox)
    assert fixed["reward"] == 1.0 and fixed["reward_info"]["fail_to_pass"] == {"passed": 2, "total": 2}
    assert "or" in fixed["metadata"]["patch"]
    idle = _run(tiny_model, agent, ["true"], tmp_path, DEMO_TASK, verifier, sandbox=sandbox)
    assert idle["reward"] == 0.0 and idle["failure_reason"] is None
