"""Real CLIs (one per dialect) against replies that open with reasoning: each gets the reasoning in its dialect's
own field, still runs its tool, and sends the reasoning back its own way; the next call extends the one that
sampled it token-exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hrl.runners.agents import get_agent
from hrl.runners.doctor.agents import PROBE_FILE, PROBE_TEXT, probe_agent, trace_problems
from tests.conftest import install_agent


def _thinking(turn: Any, i: int) -> Any:
    pre = f"<think>\nStep {i}: plan it.\n</think>\n\n"
    return pre + turn if isinstance(turn, str) else {**turn, "text": pre + (turn.get("text") or "")}


@pytest.mark.agents
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["opencode", "codex", "claude-code", "gemini-cli"])
def test_cli_takes_and_replays_reasoning(name, tiny_model):
    install_agent(name, "local")
    runner = get_agent(name)
    turns = [_thinking(t, i) for i, t in enumerate(runner.smoke_turns(PROBE_FILE, PROBE_TEXT))]
    probe = asyncio.run(probe_agent(name, tiny_model, "local", time_budget_s=300, turns=turns))
    assert probe.outcome.ok, (probe.outcome.failure_reason, probe.outcome.stderr_tail[-800:])
    assert (probe.file_text or "").strip() == PROBE_TEXT
    assert trace_problems(probe.trace, runner.dialect) == []
    main = [c for c in probe.trace["calls"] if not c["side"]]
    assert main[0]["finish_reason"] == "tool_calls" and main[-1].get("parent") == main[-2]["call_id"]
