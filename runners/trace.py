"""`hrl.trace/1`: one JSON object per finished episode, one per line, append-only. The one module that knows it.

A public, versioned contract (see docs/trace-format.md; golden files in tests/golden/): fields are added, never
renamed. A call stores its prompt whole (`prompt_ids`) or as a reference to the first `length` tokens of an
earlier call's prompt + response plus `prompt_suffix_ids`, so a trace grows linearly with the conversation.
`versions` is run-length: `[start index in response_ids, policy version]` pairs.

Here: the typed record (`Trace`, `TraceCall`, `ToolEvent`), reading (`read_traces`, `read_trace_file`, which
tolerates a last line cut by a crash, `validate_trace`) and writing (`encode_trace`, `TraceWriter`, which keeps
secrets out with `redact_trace`), the failure reasons and which of them are the infrastructure's, the versions rule
(`add_version`, `expand_versions`), and the token tree (`branches`): the one implementation that training samples
and `hrl inspect` both walk, each with its own `keep` filter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from hrl.errors import HrlError
from hrl.runners.durable import append_durably
from hrl.runners.redact import Redactor, default_redactor

__all__ = [
    "FAILURE_REASONS",
    "INFRA_FAILURES",
    "SCHEMA",
    "AgentNode",
    "Export",
    "ToolEvent",
    "Trace",
    "TraceCall",
    "TraceFile",
    "TraceFormatError",
    "TraceWriter",
    "add_version",
    "all_prompt_ids",
    "binary_success",
    "branches",
    "call_prompt_ids",
    "dropped_media",
    "encode_trace",
    "expand_versions",
    "full_len",
    "is_infra_failure",
    "prompt_len",
    "read_trace_file",
    "read_traces",
    "redact_trace",
    "sampled_versions",
    "trace_success",
    "validate_trace",
    "without_calls",
    "write_trace",
]

SCHEMA = "hrl.trace/1"
Export = Callable[[dict[str, Any], Path], None]  # a trace as written (redacted) and its file: the run's OTLP export
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
# Failures of the machinery, not of the policy: never trained on, counted per step and per rollout. `no_llm_calls`
# is one: an agent that ended before its first model call (a crash at start, a harness that never reached the
# proxy) did nothing the policy chose. Every other reason (timeout, crash, exit, context overflow, after a call)
# is the policy's doing: it keeps reward 0 and is trained on, since dropping a timeout would teach the policy to
# time out.
INFRA_FAILURES = frozenset(
    {"sandbox_error", "engine_error", "verifier_error", "internal_error", "cancelled", "no_llm_calls"}
)
FinishReason = Literal["stop", "length", "tool_calls", "abort", "error"]


class PromptRef(TypedDict):
    call_id: str  # an earlier call of the same trace
    length: int  # how many tokens of that call's prompt + response this prompt starts with


class TraceCall(TypedDict):
    """One LLM call. Times are seconds from the trace's `started_at`."""

    call_id: str
    dialect: str  # chat | responses | anthropic | gemini
    stream: bool
    side: bool  # not an agent turn (title generation, memory extraction): not trained on by default
    started_at: float
    first_token_at: float
    ended_at: float
    prompt_ids: NotRequired[list[int]]  # the whole prompt, or …
    prompt_ref: NotRequired[PromptRef]  # … a prefix of an earlier call's prompt + response,
    prompt_suffix_ids: NotRequired[list[int]]  # … then these ids
    response_ids: list[int]  # what the engine sampled, never re-tokenized
    response_logprobs: list[float]
    versions: list[list[int]]  # run-length [start index in response_ids, policy version]
    finish_reason: FinishReason
    parent: NotRequired[str]  # the call whose prompt + response this prompt extends exactly (token-tree parent)
    error: NotRequired[str]  # what failed, with finish_reason "error"
    agent: NotRequired[str]  # the sub-agent that made the call (see Trace.agents); absent: the root agent
    trainable: NotRequired[bool]  # False: recorded, never trained on (an untrained critic); absent: True
    tool_parse_error: NotRequired[str]  # tool-call markup the parser could not read (it reached the agent as text)
    sampling: NotRequired[dict[str, dict[str, float]]]  # {asked, used}: the agent's sampling knobs, and those used
    dropped_media: NotRequired[dict[str, int]]  # media parts left out of the request, by kind (proxy.media: drop)
    media: NotRequired[
        list[dict[str, Any]]
    ]  # the prompt's images: {sha256, mime, bytes, width, height, placeholder[, grid]}
    image_processor: NotRequired[dict[str, Any]]  # the settings the engine's image processor made their pixels with
    tool_prompt: NotRequired[str]  # the proxy showed the tools in this tool prompt (hermes): the template cannot


class ToolEvent(TypedDict):
    name: str
    tool_call_id: str
    started_at: float  # the response that asked for the tool, seconds from the trace's start
    ended_at: float  # the request that brought its result


class Trace(TypedDict):
    """One finished episode."""

    schema: str  # SCHEMA
    trace_id: str
    session: str
    task_id: str | None
    group_id: str | None  # the GRPO group: traces of one task in one batch
    agent: dict[str, Any]  # {name, version}
    env: dict[str, Any]  # {sandbox, image, version}
    model: dict[str, Any]  # {name}
    status: Literal["ok", "failed"]
    failure_reason: str | None  # one of FAILURE_REASONS
    reward: float | None
    reward_info: dict[str, Any]
    success: NotRequired[bool | None]  # the task's own pass/fail rule, apart from a shaped reward; absent: older
    started_at: float  # epoch seconds
    ended_at: float
    calls: list[TraceCall]
    tools: list[ToolEvent]
    metadata: NotRequired[dict[str, Any]]  # rejected_requests: how many requests got a 4xx
    rejected: NotRequired[list[dict[str, Any]]]  # the last 100 of those: {at, dialect, status, error}
    agents: NotRequired[list[AgentNode]]  # the tree of agents, root first; only when there are sub-agents
    degenerate: NotRequired[bool]  # True: one model call for an agentic task (it offered tools); absent: not
    dropped_media: NotRequired[dict[str, int]]  # media left out of its calls' requests, by kind; absent: none


class AgentNode(TypedDict):
    """One agent of a trace's agent tree: the root agent, or a sub-agent (a child session, a recognised CLI
    sub-agent) whose calls carry its `name` as their `agent`."""

    name: str
    parent: str | None  # the agent that started it; None for the root
    trainable: bool
    calls: int


_REQUIRED = ("schema", "trace_id", "session", "status", "calls", "started_at", "ended_at")
_CALL_REQUIRED = ("call_id", "dialect", "stream", "response_ids", "response_logprobs", "versions", "finish_reason")


class TraceFormatError(HrlError, ValueError):
    """A trace line is not valid `hrl.trace/1`; the message names the file and line, `hint` what to do (None: the
    CLI's hint for a file of the wrong kind)."""


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
    if obj.get("success") is not None and not isinstance(obj["success"], bool):
        raise ValueError(f"success must be true, false or null, not {obj['success']!r}")
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


def without_calls(outcome: dict[str, Any]) -> dict[str, Any]:
    """The outcome of an episode whose agent ended before its first model call: `no_llm_calls`, a harness failure
    with no reward (the policy chose nothing); the agent's own failure (`agent_failure`: a crash at start) and a
    verifier's reward (`reward_without_calls`) are kept in the metadata, beside the agent's last output."""
    extra = dict(outcome.get("extra") or {})
    if outcome.get("failure_reason") is not None:
        extra["agent_failure"] = outcome["failure_reason"]
    if outcome.get("reward") is not None:
        extra["reward_without_calls"] = outcome["reward"]
    return {**outcome, "status": "failed", "failure_reason": "no_llm_calls", "reward": None, "success": None,
            "extra": extra}  # fmt: skip


def is_infra_failure(trace: dict[str, Any]) -> bool:
    """Did the machinery (not the policy) fail this episode? Such traces are left out of training and counted."""
    return trace.get("failure_reason") in INFRA_FAILURES


def binary_success(reward: float | None, info: dict[str, Any] | None = None) -> bool | None:
    """Success where a verifier gave none beside its reward: `info["success"]` when it is a bool (a verifier may say
    it there), else a reward of exactly 0 or 1 read as a binary rule's verdict. Any other number (a fraction, a
    shaped score) says nothing of the task's own rule, and no reward is no grade: None."""
    said = (info or {}).get("success")
    if isinstance(said, bool):
        return said
    if reward is None or reward not in (0.0, 1.0):
        return None
    return reward == 1.0


def trace_success(trace: dict[str, Any]) -> bool | None:
    """Whether the episode solved its task by the task's own rule: the trace's `success`; for a trace written before
    that field existed, `reward == 1.0` (None without a reward)."""
    if "success" in trace:
        value = trace["success"]
        return value if isinstance(value, bool) else None
    reward = trace.get("reward")
    return None if reward is None else reward == 1.0


def dropped_media(trace: dict[str, Any]) -> dict[str, int]:
    """Media parts (image, document, audio, video) the proxy left out of the trace's requests (`proxy.media:
    drop`), by kind; {} for none. The model answered without seeing what the agent showed it, so training leaves
    such a trace out unless `train.keep_dropped_media`."""
    return dict(trace.get("dropped_media") or {})


def image_calls(trace: dict[str, Any]) -> int:
    """Calls whose prompt held images (`media`): training reads their bytes from `media/` and makes their pixels
    again (`hrl.train.media`)."""
    return sum(bool(c.get("media")) for c in trace.get("calls") or [])


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


def prompt_len(call: dict[str, Any]) -> int:
    """Full prompt length of a call, resolving a prompt reference by its length only."""
    ref = call.get("prompt_ref")
    if ref is None:
        return len(call["prompt_ids"])
    return int(ref["length"]) + len(call.get("prompt_suffix_ids", []))


def full_len(call: dict[str, Any]) -> int:
    return prompt_len(call) + len(call["response_ids"])


# ---- the versions rule ------------------------------------------------------------------------------------


def add_version(runs: list[Any], at: int, version: int, n_tokens: int) -> None:
    """Record that `n_tokens` tokens starting at response index `at` were sampled by `version`: a new run starts
    only when the version changes (and only for a delta that carries tokens)."""
    if n_tokens and (not runs or runs[-1][1] != version):
        runs.append((at, version))


def expand_versions(runs: list[Any], n: int) -> list[int]:
    """Run-length versions → the version of each of `n` response tokens."""
    out = [0] * n
    for j, (start, version) in enumerate(runs):
        end = runs[j + 1][0] if j + 1 < len(runs) else n
        out[start:end] = [version] * (end - start)
    return out


def sampled_versions(call: dict[str, Any]) -> list[int]:
    """Policy versions of the call's sampled tokens, in order (runs that cover no token dropped)."""
    n = len(call["response_ids"])
    return [int(v) for start, v in call["versions"] if start < n]


# ---- the token tree ---------------------------------------------------------------------------------------


def branches(trace: dict[str, Any], keep: Callable[[dict[str, Any]], bool] | None = None) -> list[list[int]]:
    """Root-to-leaf paths of call indices through the trace's token tree, one per leaf, in leaf order.

    A call's parent is the earlier call it names as `parent`. `keep` selects the calls that are nodes (default:
    all); a call whose parent is not kept becomes a root, so its prompt counts as text, not as sampled tokens.
    """
    calls = trace["calls"]
    index: dict[str, int] = {}
    parent: dict[int, int | None] = {}
    for i, c in enumerate(calls):
        if keep is None or keep(c):
            parent[i] = index.get(c.get("parent", ""))
            index[c["call_id"]] = i
    inner = {p for p in parent.values() if p is not None}
    paths = []
    for leaf in parent:
        if leaf in inner:
            continue
        path: list[int] = []
        node: int | None = leaf
        while node is not None:
            path.append(node)
            node = parent[node]
        paths.append(path[::-1])
    return paths


def read_traces(path: str | Path, *, on_cut: Callable[[int], None] | None = None) -> Iterator[dict[str, Any]]:
    """Yield validated traces from a JSONL file; a bad line raises TraceFormatError naming file and line.

    A last line cut short (no newline after it, and not JSON: its writer died mid-write) raises too, unless `on_cut`
    is given: then it is skipped and its line number handed to `on_cut` (readers that show a crashed run). A line
    that is not JSON anywhere else is damage no crash leaves, and always raises. So does a line that is not UTF-8
    text (a binary file given by mistake)."""
    with Path(path).open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode()
            except UnicodeDecodeError as e:
                if e.end == len(raw) and on_cut is not None:  # the last line, cut short inside a character
                    on_cut(lineno)
                    return
                raise TraceFormatError(
                    f"{path}:{lineno}: not a valid {SCHEMA} trace: not UTF-8 text ({e.reason} at byte {e.start})"
                ) from e
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:  # JSONDecodeError is a ValueError
                last = not line.endswith("\n")  # only the file's last line can lack its newline
                if last and on_cut is not None:
                    on_cut(lineno)
                    return
                raise _not_json(path, lineno, last, e) from e
            try:
                validate_trace(obj)
            except ValueError as e:
                raise TraceFormatError(f"{path}:{lineno}: not a valid {SCHEMA} trace: {e}") from e
            yield obj


def _not_json(path: str | Path, lineno: int, last: bool, e: ValueError) -> TraceFormatError:
    if last:
        return TraceFormatError(
            f"{path}:{lineno}: the last line is cut short ({e}): its writer stopped mid-write",
            hint="`hrl inspect` and `hrl report` read the complete lines before it",
        )
    return TraceFormatError(
        f"{path}:{lineno}: not a valid {SCHEMA} trace: not JSON ({e})",
        hint=f"line {lineno} is damaged (only a file's last line can be cut by a crash): repair or remove it",
    )


@dataclass(frozen=True)
class TraceFile:
    """A trace file as `read_trace_file` found it: its complete traces, and the line cut short at its end, if any."""

    path: Path
    traces: list[dict[str, Any]]
    cut_line: int | None = None  # the last line, cut short (a crash mid-write) and left out; None: the file is whole


def read_trace_file(path: str | Path) -> TraceFile:
    """Every complete trace of a file, tolerating a last line cut short (`read_traces` with `on_cut`)."""
    cut: list[int] = []
    traces = list(read_traces(path, on_cut=cut.append))
    return TraceFile(Path(path), traces, cut[0] if cut else None)


def encode_trace(trace: dict[str, Any]) -> str:
    """The trace as one compact JSON line, newline included: the bytes every trace file holds."""
    return json.dumps(trace, separators=(",", ":")) + "\n"


class TraceWriter:
    """Appends one trace per line; each write is a single `write` + flush + fsync, so a crash loses nothing
    already written and never leaves half a line behind for the next append to corrupt.

    Secrets stay out: what is written is `redact_trace(trace, redactor)`, with `redactor=True` the process's
    default (`runners.redact.default_redactor`, built once from os.environ), a `Redactor` of your own, or False
    for none (byte-exact writes in tests). The caller's trace is not changed.

    `export`: given each trace once it is on disk, as written (redacted), with the file: a run with a telemetry
    endpoint passes its OTLP exporter's `export_written` (`runners.telemetry.otlp`); None exports nothing."""

    def __init__(self, path: str | Path, *, redactor: Redactor | bool = True, export: Export | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.redactor = default_redactor() if redactor is True else redactor or None
        self.export = export

    def write(self, trace: dict[str, Any]) -> None:
        validate_trace(trace)
        written = redact_trace(trace, self.redactor) if self.redactor else trace
        append_durably(self.path, encode_trace(written).encode())
        if self.export is not None:
            self.export(written, self.path)


def write_trace(path: str | Path, trace: dict[str, Any], export: Export | None = None) -> None:
    """Append one trace to `path` as `TraceWriter` does (validated, redacted by the process's default redactor,
    one durable line, then `export`): every writer of trace files goes through here or through a `TraceWriter`
    of its own."""
    TraceWriter(path, export=export).write(trace)


_IDENTITY = frozenset({"schema", "trace_id", "session", "calls"})  # never redacted (calls: only their `error`)


def redact_trace(trace: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    """A copy of `trace` with its text redacted: every field but the identity ones (`schema`, `trace_id`, `session`:
    a session token is hrl's, no host secret), so fields added later are covered too, and each call's `error`.
    Token ids cannot be redacted after the fact: the proxy redacts request text before it tokenizes it."""
    out = {k: v if k in _IDENTITY else redactor.obj(v) for k, v in trace.items()}
    out["calls"] = [
        {**call, "error": redactor.text(call["error"])} if isinstance(call.get("error"), str) else call
        for call in trace["calls"]
    ]
    return out
