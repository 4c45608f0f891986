"""Black-box sub-agents: the calls a CLI makes for a sub-agent it started are a child branch of the same trace.

Over HTTP with the request shapes each CLI sends (everywhere), and with the real Claude Code and opencode driven by
the scripted engine into delegating to a sub-agent (`agents` marker, in CI)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hrl.runners.doctor.agents import probe_agent
from hrl.runners.serving.stack import serving
from hrl.runners.trace import branches
from hrl.train.samples import build_samples
from tests.conftest import install_agent

MAIN_SYSTEM = "x-anthropic-billing-header: cc_version=2.1.197.eac; cc_entrypoint=sdk-cli;\n\nYou are a Claude agent."
SUB_SYSTEM = (
    "x-anthropic-billing-header: cc_version=2.1.197.179; cc_entrypoint=sdk-cli; cc_is_subagent=true;\n\nYou are a "
    "Claude agent.\n\nYou are an agent for Claude Code, Anthropic's official CLI for Claude."
)
OPENCODE = {"User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14"}  # as 1.18.33 sends it
BASH = {
    "name": "Bash",
    "description": "run",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def _messages(system: str, user: str) -> dict:
    return {"model": "m", "max_tokens": 32, "system": [{"type": "text", "text": system}], "tools": [BASH],
            "messages": [{"role": "user", "content": user}]}  # fmt: skip


def _run(tiny_model: str, requests: list[tuple[str, dict, dict]]) -> dict:
    async def main() -> dict:
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}) as stack:
            token = stack.proxy.open_session(meta={"agent": {"name": "cli"}}).token
            async with httpx.AsyncClient(base_url=f"{stack.url}/s/{token}") as http:
                for path, body, headers in requests:
                    assert (await http.post(path, json=body, headers=headers)).status_code == 200
            return stack.proxy.end_session(token, reward=1.0)

    return asyncio.run(main())


def test_claude_code_task_subagents_are_children_one_per_invocation(tiny_model):
    trace = _run(tiny_model, [
        ("/v1/messages", _messages(MAIN_SYSTEM, "fix it"), {}),
        ("/v1/messages", _messages(SUB_SYSTEM, "find the bug"), {}),
        ("/v1/messages", _messages(SUB_SYSTEM, "write the test"), {}),
    ])  # fmt: skip
    assert [c.get("agent") for c in trace["calls"]] == [None, "claude-code/task", "claude-code/task#2"]
    assert [(a["name"], a["parent"], a["calls"]) for a in trace["agents"]] == [
        ("cli", None, 1), ("claude-code/task", "cli", 1), ("claude-code/task#2", "cli", 1)
    ]  # fmt: skip
    assert len(branches(trace)) == len(build_samples(trace)) == 3  # a CLI's own sub-agents are trained


def test_opencode_subagents_are_recognised_by_their_own_session_id(tiny_model):
    def chat(text: str) -> dict:  # distinct bodies: an identical one would be taken for a retry
        return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}],
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}  # fmt: skip

    trace = _run(tiny_model, [
        ("/v1/chat/completions", chat("fix it"), {"x-session-id": "ses_main", **OPENCODE}),
        ("/v1/chat/completions", chat("find the bug"), {"x-session-id": "ses_sub", **OPENCODE}),
        ("/v1/chat/completions", chat("fix it again"), {"x-session-id": "ses_main", **OPENCODE}),
    ])  # fmt: skip
    assert [c.get("agent") for c in trace["calls"]] == [None, "opencode/task", None]


def test_an_agent_without_subagents_has_no_agent_tree(tiny_model):
    trace = _run(tiny_model, [("/v1/messages", _messages(MAIN_SYSTEM, t), {}) for t in ("fix it", "and test it")])
    assert len(trace["calls"]) == 2 and "agents" not in trace and all("agent" not in c for c in trace["calls"])


# ---- the real CLIs --------------------------------------------------------------------------------------------

DELEGATE = {
    "claude-code": ("Agent", "general-purpose", "claude-code/task"),
    "opencode": ("task", "general", "opencode/task"),
}


@pytest.mark.agents
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", list(DELEGATE))
def test_a_real_cli_subagent_is_a_child_branch(name, tiny_model):
    tool, kind, child = DELEGATE[name]
    install_agent(name, "local")
    args = {"description": "Say hi", "prompt": "Reply with the word hi.", "subagent_type": kind}
    turns = [{"tool_calls": [{"name": tool, "arguments": args}]}, "hi", "done"]
    probe = asyncio.run(probe_agent(name, tiny_model, "local", time_budget_s=300, turns=turns,
                                    prompt="Ask a sub-agent to say hi."))  # fmt: skip
    trace = probe.trace
    assert probe.outcome.exit_code == 0, probe.outcome.stderr_tail
    main = [c for c in trace["calls"] if "agent" not in c and not c["side"]]
    sub = [c for c in trace["calls"] if c.get("agent") == child]
    assert len(main) >= 2 and sub, [(c.get("agent"), c["finish_reason"]) for c in trace["calls"]]
    assert main[0]["finish_reason"] == "tool_calls" and main[-1]["parent"] == main[0]["call_id"]
    assert trace["agents"][1]["name"] == child and trace["agents"][1]["calls"] == len(sub)
    assert trace["calls"].index(sub[0]) < trace["calls"].index(main[-1])  # it ran inside the main agent's tool call


def test_registered_subagents_sending_the_same_body_keep_every_call(tiny_model):
    """Voters and best-of-n: three sub-agents send the identical request and get three replies, which are three
    calls of the trace; only the same agent resending its last request is a retry (recorded once)."""

    async def main() -> dict:
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}) as stack:
            root = stack.proxy.open_session(meta={"agent": {"name": "judge"}}).token
            voters = [stack.proxy.open_child(root, f"voter{i}").token for i in range(3)]
            body = {
                "model": "m",
                "max_tokens": 8,
                "temperature": 1.0,
                "messages": [{"role": "user", "content": "vote"}],
            }
            async with httpx.AsyncClient(base_url=stack.url) as http:
                replies = await asyncio.gather(*(http.post(f"/s/{t}/v1/chat/completions", json=body) for t in voters))
                assert all(r.status_code == 200 for r in replies)
                again = await http.post(f"/s/{voters[0]}/v1/chat/completions", json=body)  # voter0 retries
                assert again.status_code == 200
            return stack.proxy.end_session(root, reward=1.0)

    trace = asyncio.run(main())
    assert sorted(c.get("agent") for c in trace["calls"]) == ["voter0", "voter1", "voter2"]
    assert {a["name"]: a["calls"] for a in trace["agents"]} == {"judge": 0, "voter0": 1, "voter1": 1, "voter2": 1}
