"""Turn scores recorded through the real proxy: a `TurnScorer` on a session's `on_call` hook scores the sandbox as
each call arrives (the tests verifier, a local sandbox), and the trace's calls and metadata carry what it found."""

from __future__ import annotations

import asyncio

import httpx

from hrl.runners.rollouts.turns import TurnScorer
from hrl.runners.serving.stack import serving
from tests.runners.tasks.test_verifier import mini_task, verifier


def test_each_call_records_the_score_of_the_state_it_arrived_at(tiny_model):
    """The "agent" (this test) asks the model, fixes the bug by hand between its calls, asks again: the first call
    scores the starting state (test_add fails: 2 of 3 tests pass), the second the fixed one, the end the verdict's."""
    task, v = mini_task("local"), verifier("local")

    async def episode():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["one", "two", "three"]}) as stack:
            session = stack.proxy.open_session(meta={"task_id": task.instance_id})
            async with await v.backend.create(v.sandbox_spec(task), v.config.run_id, "agent") as sandbox:
                await v.prepare(sandbox, task)
                scorer = TurnScorer(v, sandbox, task, timeout_s=120)
                session.on_call = scorer.arrived

                async def ask(client, text):
                    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
                    r = await client.post(f"{stack.url}/s/{session.token}/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text

                async with httpx.AsyncClient(timeout=120) as client:
                    await ask(client, "fix it")
                    await sandbox.exec(["bash", "-c", "sed -i 's/a - b/a + b/' mini/__init__.py"])
                    await ask(client, "done?")
                    await ask(client, "sure?")  # the same diff: not graded again
                await scorer.settle()
                verdict = await v.verify(sandbox, task)
            return stack.proxy.end_session(session.token, reward=verdict.reward,
                                           extra={"turn_scores": scorer.summary(verdict)})  # fmt: skip

    trace = asyncio.run(episode())
    assert [c["turn_score"] for c in trace["calls"]] == [2 / 3, 1.0, 1.0]
    assert trace["metadata"]["turn_scores"]["final"] == 1.0
    assert trace["metadata"]["turn_scores"]["states"] == 2 and trace["metadata"]["turn_scores"]["failed"] == 0


def test_a_session_without_the_hook_records_no_turn_score(tiny_model):
    async def episode():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["one"]}) as stack:
            session = stack.proxy.open_session()
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
                await client.post(f"{stack.url}/s/{session.token}/v1/chat/completions", json=body)
            return stack.proxy.end_session(session.token, reward=1.0)

    (call,) = asyncio.run(episode())["calls"]
    assert "turn_score" not in call
