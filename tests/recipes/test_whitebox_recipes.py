"""The bundled white-box recipes through the real frameworks (LangGraph + langchain-openai, the OpenAI Agents SDK,
the `openai` SDK), the real proxy and harness, with the scripted engine playing the model's turns as real ids."""

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
from hrl.runners.trace import branches, read_traces
from hrl.train.samples import build_samples


def _episode(model: str, recipe: str, turns: list, tmp_path: Path, verifier: dict | None = None, **rollout) -> dict:
    cfg = load_recipe(recipe)
    task = load_tasks(cfg["tasks"])[0]
    out = tmp_path / "traces.jsonl"

    async def main() -> dict:
        async with serving(model, "scripted", engine_options={"turns": turns},
                           control_token=secrets.token_urlsafe(32)) as stack:  # fmt: skip
            config = RolloutConfig(**{**cfg["rollout"], **rollout})
            rollouts = make_rollouts(stack, config, verifier=verifier or cfg["verifier"], base_dir=cfg["recipe_dir"])
            return await rollouts.episode(Episode(task, 0, 0), out)

    trace = asyncio.run(main())
    assert [t["trace_id"] for t in read_traces(out)] == [trace["trace_id"]]  # exactly one trace, written
    assert trace["task_id"] == task.instance_id and trace["failure_reason"] is None, trace.get("metadata")
    return {"trace": trace, "answer": task.answer, "task": task}


def _expr(problem: str) -> str:
    return problem.split("What is ")[-1].split("?")[0]


def test_langgraph_react_calls_its_tool_and_is_scored_by_the_verifier(tiny_model, tmp_path):
    task = load_tasks(load_recipe("langgraph-react")["tasks"])[0]
    turns = [{"tool_calls": [{"name": "calculator", "arguments": {"expression": _expr(task.problem_statement)}}]},
             f"{task.answer}"]  # fmt: skip
    trace = _episode(tiny_model, "langgraph-react", turns, tmp_path)["trace"]
    assert trace["agent"]["version"] == "subprocess"  # rollout.mode auto: closed in its own namespace
    assert [c["finish_reason"] for c in trace["calls"]] == ["tool_calls", "stop"]
    assert trace["calls"][1]["parent"] == trace["calls"][0]["call_id"]  # the ReAct loop extends one branch
    assert [t["name"] for t in trace["tools"]] == ["calculator"]
    assert trace["reward"] == 1.0 and trace["reward_info"]["got"] == task.answer


def test_langgraph_react_wrong_answer_gets_only_format_credit(tiny_model, tmp_path):
    trace = _episode(tiny_model, "langgraph-react", ["I think it is 5."], tmp_path)["trace"]
    assert trace["reward"] == 0.1 and trace["reward_info"]["got"] == "5"  # a number, the wrong one


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_sdk_handoff_is_a_child_branch_of_the_same_trace(tiny_model, tmp_path, monkeypatch, api):
    monkeypatch.setenv("HRL_AGENTS_API", api)
    monkeypatch.setenv("HRL_SANDBOX_ENV_PASSTHROUGH", "HRL_AGENTS_API")  # a closed agent sees only what is named
    task = load_tasks(load_recipe("agents-sdk")["tasks"])[0]
    turns = [{"tool_calls": [{"name": "transfer_to_specialist", "arguments": {}}]}, f"{task.answer}"]
    trace = _episode(tiny_model, "agents-sdk", turns, tmp_path)["trace"]
    triage = [c for c in trace["calls"] if "agent" not in c]
    specialist = [c for c in trace["calls"] if c.get("agent") == "specialist"]
    assert len(triage) == 1 and len(specialist) == 1, trace["calls"]
    assert triage[0]["finish_reason"] == "tool_calls" and specialist[0]["dialect"] == api
    assert [a["name"] for a in trace["agents"]] == ["python:agent.py:run", "specialist"]
    assert trace["agents"][1]["parent"] == "python:agent.py:run" and trace["agents"][1]["trainable"]
    assert trace["reward"] == 1.0
    # both agents are trained: two branches, one advantage and one unit of loss weight for the episode
    samples = build_samples(trace)
    assert len(branches(trace)) == len(samples) == 2
    assert abs(sum(sum(s.weight) for s in samples) - 1.0) < 1e-9


def test_multi_agent_critic_is_recorded_but_never_trained(tiny_model, tmp_path):
    cfg = load_recipe("multi-agent")
    task = load_tasks(cfg["tasks"])[0]
    # the engine plays turns by position in a conversation: the solver answers 12, the critic (its first turn
    # too) says "12", not OK, so the solver tries again (its second turn) and answers right
    turns = ["12", f"{task.answer}"]
    trace = _episode(tiny_model, "multi-agent", turns, tmp_path)["trace"]
    critic = [c for c in trace["calls"] if c.get("agent") == "critic"]
    solver = [c for c in trace["calls"] if "agent" not in c]
    assert len(critic) == 1 and critic[0]["trainable"] is False and len(solver) == 2
    assert trace["reward"] == 1.0  # the verifier reads the solver's last answer, not the critic's
    samples = build_samples(trace)
    assert [s.branch for s in samples] == [[c["call_id"] for c in solver]]


def test_subprocess_mode_runs_sync_code_against_the_environment(tiny_model, tmp_path):
    agent = tmp_path / "sync_agent.py"
    agent.write_text(
        "import os\nfrom openai import OpenAI\n\n"
        "def run(task, session):\n"
        "    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY point at the session\n"
        "    out = client.chat.completions.create(model=os.environ['OPENAI_MODEL'],\n"
        "        messages=[{'role': 'user', 'content': task.problem_statement}], max_tokens=16)\n"
        "    session.reward(0.5 if out.choices[0].message.content else 0.0, {'pid': os.getpid()})\n"
    )
    # no verifier function: the agent's own reward is the episode's (beside one, the verifier's would be)
    result = _episode(tiny_model, "multi-agent", ["hello"], tmp_path, {"name": "python"}, agent=f"{agent}:run",
                      mode="subprocess")  # fmt: skip
    trace = result["trace"]
    assert len(trace["calls"]) == 1 and trace["reward"] == 0.5
    assert trace["reward_info"]["pid"] != __import__("os").getpid()  # it ran in another process
