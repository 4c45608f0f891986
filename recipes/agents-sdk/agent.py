"""An OpenAI Agents SDK agent with a handoff: a triage agent hands arithmetic to a specialist, a sub-agent of the
session, so the specialist's calls are a child branch of the same trace. Chat Completions by default;
HRL_AGENTS_API=responses speaks the Responses API instead (the proxy serves both)."""

from __future__ import annotations

import os
from typing import Any

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded

set_tracing_disabled(True)  # no trace export to a hosted service: hrl records every call already


def _model(s: Any) -> Any:
    if os.environ.get("HRL_AGENTS_API") == "responses":
        return OpenAIResponsesModel(model=s.model, openai_client=s.openai(max_retries=0))
    return OpenAIChatCompletionsModel(model=s.model, openai_client=s.openai(max_retries=0))


async def run(task: Any, session: Any) -> float | None:
    settings = ModelSettings(max_tokens=48, temperature=1.0)
    async with session.child("specialist") as child:
        specialist = Agent(name="specialist", instructions="You do arithmetic exactly. Reply with the number only.",
                           model=_model(child), model_settings=settings)  # fmt: skip
        triage = Agent(name="triage", instructions="You run a help desk. Hand arithmetic questions to the specialist.",
                       handoffs=[specialist], model=_model(session), model_settings=settings)  # fmt: skip
        try:
            await Runner.run(triage, task.problem_statement, max_turns=4)
        except MaxTurnsExceeded:
            return 0.0
    return None  # the recipe's verifier reads the last answer
