"""White-box agents: Python programs (LangGraph, the OpenAI Agents SDK, your own) trained through the same proxy
as the CLIs. `session` / `current_session` are the public API (re-exported as `hrl.session`); `harness` runs a
`python:MODULE:FUNCTION` agent as a rollout."""

from hrl.runners.whitebox.client import NoSessionError, SessionAPIError, WhiteboxSession, current_session, session

__all__ = ["NoSessionError", "SessionAPIError", "WhiteboxSession", "current_session", "session"]
