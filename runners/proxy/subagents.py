"""Black-box sub-agents: calls an agent CLI makes for a sub-agent it started, recognised and recorded as a child.

A CLI's sub-agents share its session token (its base URL and API key), so the proxy tells them apart by what
they send:

- Claude Code's Agent (formerly Task) tool runs each sub-agent with its own system prompt: its billing header says
  `cc_is_subagent=true` and it goes on "You are an agent for Claude Code" (2.1.197, checked against the real CLI
  in tests/runners/proxy/test_subagents.py). Each invocation (its system prompt and first user message) is one
  child, `claude-code/task`.
- opencode gives each sub-agent (its `task` tool) a session of its own and sends that session's id as
  `x-session-id`: the first id a trace sees is the main agent's; every other one is a child, `opencode/task`.
  Only from opencode (its user agent, `opencode/<version> ai-sdk/…`): another client's `x-session-id` says
  nothing about sub-agents, and a new value on every request must not become a new trainable agent each time.

Each child counts against `proxy.max_children` (the proxy refuses one more with a 429).

White-box agents need none of this: they register their children (`POST /sessions` with `parent`). Any client may
also say what a call is, with the header `x-hrl-call`: `side` records it in the child `side`, never trained (a
title, a summary, a judge's call made through the session), and `main` keeps it the session's own whatever the
markers above say (docs/online.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from hrl.runners.proxy.dialects.base import ChatRequest
from hrl.runners.proxy.session import Session

__all__ = ["CALL_HEADER", "PROMPT_MARKERS", "recognise_subagent"]

# (text near the start of a sub-agent's system prompt, the child's name)
PROMPT_MARKERS = (("cc_is_subagent=true", "claude-code/task"), ("You are an agent for Claude Code", "claude-code/task"))
_HARNESS_SESSION_HEADER = "x-session-id"  # opencode: one per opencode session, sub-agents included
_OPENCODE_AGENT = "opencode/"  # how opencode's User-Agent starts (opencode/1.18.33 ai-sdk/provider-utils/…)
CALL_HEADER = "x-hrl-call"  # main | side: what the client says a call is


def _first(req: ChatRequest, role: str) -> str:
    text = next((m.get("content") for m in req.messages if m["role"] == role), "")
    return text if isinstance(text, str) else str(text)


def recognise_subagent(session: Session, headers: Mapping[str, str], req: ChatRequest) -> Session:
    """The session a request records into: `session`, or the child for the sub-agent that sent it."""
    if session.root is not session:  # a registered child says what it is
        return session
    said = headers.get(CALL_HEADER, "").strip().lower()
    if said == "side":
        return session.child("side", "side", trainable=False)
    if said == "main":
        return session
    system = _first(req, "system")
    for marker, name in PROMPT_MARKERS:
        if marker in system[:1000]:
            key = hashlib.blake2b((system + "\0" + _first(req, "user")).encode(), digest_size=12).hexdigest()
            return session.child(f"{name}:{key}", name)
    harness = headers.get(_HARNESS_SESSION_HEADER)
    if harness and headers.get("User-Agent", "").lower().startswith(_OPENCODE_AGENT):
        if session.harness_session is None:
            session.harness_session = harness
        elif harness != session.harness_session:
            return session.child(f"opencode:{harness}", "opencode/task")
    return session
