"""`hrl.session()` over the real session API: a real proxy on a loopback port, the scripted engine playing back real
ids of the tiny model's tokenizer, the official `openai` SDK as the agent's client."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from transformers import AutoTokenizer

import hrl
from hrl.runners.serving.stack import serving
from hrl.runners.trace import branches, call_prompt_ids, full_len
from hrl.train.samples import build_samples

CONTROL = "whitebox-control-token-0123456789abcdef"
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic",
          "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]  # fmt: skip
TURNS = [{"tool_calls": [{"name": "calc", "arguments": {"expr": "6*7"}}]}, "The answer is 42."]


async def _solve(s: hrl.WhiteboxSession, i: int, critic: bool) -> None:
    """Two turns with a tool call, then (for some) a critic sub-agent that is recorded but not trained."""
    client = s.openai()
    messages = [{"role": "system", "content": "You solve arithmetic."},
                {"role": "user", "content": f"task-{i}: what is 6*7? marker{i}x"}]  # fmt: skip
    first = await client.chat.completions.create(model=s.model, messages=messages, tools=TOOLS, max_tokens=64)
    msg = first.choices[0].message
    assert msg.tool_calls, msg
    messages += [msg.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42"}]  # fmt: skip
    second = await client.chat.completions.create(model=s.model, messages=messages, tools=TOOLS, max_tokens=64)
    assert hrl.current_session() is s
    if critic:
        async with s.child("critic", trainable=False) as c:
            assert hrl.current_session() is c and c.token != s.token
            review = [{"role": "system", "content": "You review answers."},
                      {"role": "user", "content": f"marker{i}x answer: {second.choices[0].message.content}"}]  # fmt: skip
            await c.openai().chat.completions.create(model=c.model, messages=review, max_tokens=16)
        assert hrl.current_session() is s
    s.reward(i / 8, {"episode": i})


def test_eight_concurrent_sessions_become_eight_clean_traces_with_rewards_and_children(tiny_model):
    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": TURNS}, control_token=CONTROL) as stack:

            async def one(i: int) -> hrl.WhiteboxSession:
                async with hrl.session(task={"instance_id": f"t{i}"}, url=stack.url, control_token=CONTROL) as s:
                    await _solve(s, i, critic=i % 2 == 0)
                return s

            sessions = await asyncio.gather(*(one(i) for i in range(8)))
            assert stack.proxy.sessions == {}  # every root and child ended
            return sessions, {t["session"]: t for t in stack.proxy.finished}

    sessions, traces = asyncio.run(main())
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert len(traces) == 8
    for i, s in enumerate(sessions):
        trace = traces[s.token]
        assert s.result["trace_id"] == trace["trace_id"] and trace["task_id"] == f"t{i}"
        assert trace["reward"] == i / 8 and trace["reward_info"] == {"episode": i}
        for k in range(len(trace["calls"])):  # no leakage: each prompt holds only its own task
            text = tok.decode(call_prompt_ids(trace, k))
            assert f"marker{i}x" in text and not any(f"marker{j}x" in text for j in range(8) if j != i), text
        critic = [c for c in trace["calls"] if c.get("agent") == "critic"]
        main_calls = [c for c in trace["calls"] if "agent" not in c]
        assert len(main_calls) == 2 and len(critic) == (1 if i % 2 == 0 else 0)
        assert all(c["trainable"] is False for c in critic)
        if i % 2 == 0:
            assert trace["agents"] == [
                {"name": "python", "parent": None, "trainable": True, "calls": 2},
                {"name": "critic", "parent": "python", "trainable": False, "calls": 1},
            ]
        else:
            assert "agents" not in trace
        # drift 0 on the merged trace: each call extends its parent's prompt + sampled ids exactly
        assert main_calls[1]["parent"] == main_calls[0]["call_id"]
        by_id = {c["call_id"]: k for k, c in enumerate(trace["calls"])}
        for k, c in enumerate(trace["calls"]):
            if "parent" in c:
                p = by_id[c["parent"]]
                parent_full = call_prompt_ids(trace, p) + trace["calls"][p]["response_ids"]
                assert call_prompt_ids(trace, k)[: full_len(trace["calls"][p])] == parent_full
        # the critic is its own branch, and never a training sample
        assert len(branches(trace)) == 1 + len(critic)
        samples = build_samples(trace)
        assert len(samples) == 1 and samples[0].branch == [c["call_id"] for c in main_calls]


def test_a_wrong_or_ended_token_gets_401_and_records_nothing(tiny_model):
    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}, control_token=CONTROL) as stack:
            async with hrl.session(task={"instance_id": "t"}, url=stack.url, control_token=CONTROL) as s:
                async with s.child("helper") as kid:
                    pass  # the child's token is retired at the end of its block
                await s.openai().chat.completions.create(model=s.model, messages=[{"role": "user", "content": "hi"}])
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(base_url=stack.url) as http:
                codes = [
                    (await http.post(f"/s/{tok}/v1/chat/completions", json=body)).status_code
                    for tok in (s.token, kid.token, "x" * 22)
                ]
                bad_control = await http.post("/sessions", json={}, headers={"Authorization": "Bearer wrong"})
            with pytest.raises(hrl.SessionAPIError, match="403"):
                async with hrl.session(url=stack.url, control_token="wrong-token-0123456789"):
                    pass
            return codes, bad_control.status_code, dict(stack.proxy.sessions), list(stack.proxy.finished)

    codes, bad_control, open_sessions, finished = asyncio.run(main())
    assert codes == [401, 401, 401] and bad_control == 403
    assert open_sessions == {}
    assert len(finished) == 1 and len(finished[0]["calls"]) == 1 and "rejected" not in finished[0]


def test_an_exception_in_the_agent_ends_the_session_as_a_crash(tiny_model):
    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}, control_token=CONTROL) as stack:

            async def crashing_agent(calls: bool) -> None:
                async with hrl.session(url=stack.url, control_token=CONTROL) as s:
                    if calls:
                        msgs = [{"role": "user", "content": "hi"}]
                        await s.openai(max_retries=0).chat.completions.create(model=s.model, messages=msgs)
                    s.reward(1.0)
                    raise RuntimeError("boom")

            traces = []
            for calls in (True, False):
                with pytest.raises(RuntimeError, match="boom"):
                    await crashing_agent(calls)
                traces.append(stack.proxy.finished[-1])
            return traces

    after_a_call, before_any = asyncio.run(main())
    assert after_a_call["failure_reason"] == "agent_crash" and after_a_call["reward"] == 1.0
    # a crash before the first model call is the harness's, not the policy's: no reward, the crash kept
    assert before_any["failure_reason"] == "no_llm_calls" and before_any["reward"] is None
    assert before_any["metadata"]["agent_failure"] == "agent_crash"


def test_current_session_outside_a_session_says_how_to_get_one():
    with pytest.raises(hrl.NoSessionError, match="no hrl session"):
        hrl.current_session()
