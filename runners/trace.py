"""`hrl.trace/1`: one JSON object per finished episode, one per line, append-only.

A public, versioned contract (see docs/trace-format.md): fields are added, never renamed. A call stores its
prompt whole (`prompt_ids`) or as a reference to the first `length` tokens of an earlier call's prompt +
response plus `prompt_suffix_ids`, so a trace grows linearly with the conversation. `versions` is run-length:
`[start index in response_ids, policy version]` pairs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "FAILURE_REASONS",
    "INFRA_FAILURES",
    "SCHEMA",
    "TraceFormatError",
    "TraceWriter",
    "all_prompt_ids",
    "call_prompt_ids",
    "is_infra_failure",
    "read_traces",
    "validate_trace",
]

SCHEMA = "hrl.trace/1"
FAILURE_REASONS = (
    "agent_timeout",
    "agent_crash",
    "agent_exit",
    "engine_error",
    "context_overflow",
    "sandbox_error",
    "verifier_error",
    "no_llm_calls",
    "cancelled",
    "internal_error",
)
# Failures of the machinery, not of the policy: never trained on, counted per step and per rollout. Every other
# reason (timeout, crash, exit, context overflow, no LLM calls) is the policy's doing: it keeps reward 0 and is
# trained on, since dropping a timeout would teach the policy to time out.
INFRA_FAILURES = frozenset({"sandbox_error", "engine_error", "verifier_error", "internal_error", "cancelled"})
_REQUIRED = ("schema", "trace_id", "session", "status", "calls", "started_at", "ended_at")
_CALL_REQUIRED = ("call_id", "dialect", "stream", "response_ids", "response_logprobs", "versions", "finish_reason")


class TraceFormatError(ValueError):
    """A trace line is not valid `hrl.trace/1`; the message names the file and line."""


def validate_trace(obj: Any) -> None:
    """Raise ValueError describing the first problem in a decoded trace object."""
    if not isinstance(obj, dict):
        raise ValueError("a trace must be a JSON object")
    if obj.get("schema") != SCHEMA:
        raise ValueError(f"unknown schema {obj.get('schema')!r} (this hrl reads {SCHEMA})")
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"missing fields {missing}")
    reason = obj.get("failure_reason")
    if reason is not None and reason not in FAILURE_REASONS:
        raise ValueError(f"unknown failure_reason {reason!r}")
    full_len: dict[str, int] = {}  # call id -> prompt + response length, so validation stays linear
    for i, call in enumerate(obj["calls"]):
        miss = [k for k in _CALL_REQUIRED if k not in call]
        if miss:
            raise ValueError(f"call {i} misses {miss}")
        if len(call["response_ids"]) != len(call["response_logprobs"]):
            raise ValueError(f"call {call['call_id']}: response_ids and response_logprobs differ in length")
        ref = call.get("prompt_ref")
        if ref is not None:
            if ref["call_id"] not in full_len or ref["length"] > full_len[ref["call_id"]]:
                raise ValueError(f"call {call['call_id']}: prompt_ref points past an earlier call")
            prompt_len = ref["length"] + len(call.get("prompt_suffix_ids", []))
        elif "prompt_ids" in call:
            prompt_len = len(call["prompt_ids"])
        else:
            raise ValueError(f"call {call['call_id']}: neither prompt_ids nor prompt_ref")
        full_len[call["call_id"]] = prompt_len + len(call["response_ids"])


def is_infra_failure(trace: dict[str, Any]) -> bool:
    """Did the machinery (not the policy) fail this episode? Such traces are left out of training and counted."""
    return trace.get("failure_reason") in INFRA_FAILURES


def call_prompt_ids(trace: dict[str, Any], index: int) -> list[int]:
    """The full prompt ids of call `index`, resolving prompt references."""
    return all_prompt_ids(trace, index + 1)[index]


def all_prompt_ids(trace: dict[str, Any], upto: int | None = None) -> list[list[int]]:
    """Full prompt ids of the first `upto` calls (all by default), resolved in one linear pass."""
    calls = trace["calls"][:upto]
    full: dict[str, list[int]] = {}
    out = []
    for call in calls:
        ref = call.get("prompt_ref")
        if ref is None:
            prompt = list(call["prompt_ids"])
        else:
            prompt = full[ref["call_id"]][: ref["length"]] + list(call.get("prompt_suffix_ids", []))
        full[call["call_id"]] = prompt + list(call["response_ids"])
        out.append(prompt)
    return out


def read_traces(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield validated traces from a JSONL file; a bad line raises TraceFormatError naming file and line."""
    with Path(path).open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                validate_trace(obj)
            except ValueError as e:  # JSONDecodeError is a ValueError
                raise TraceFormatError(f"{path}:{lineno}: not a valid {SCHEMA} trace: {e}") from e
            yield obj


class TraceWriter:
    """Appends one trace per line; each write is a single `write` + flush + fsync, so a crash loses nothing
    already written and never leaves half a line behind for the next append to corrupt."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, trace: dict[str, Any]) -> None:
        validate_trace(trace)
        data = (json.dumps(trace, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
