"""Telemetry in: what an agent CLI exports about its own tool calls (OTLP/HTTP logs and traces), as tool events.

The proxy sees only model calls, so it infers a tool's span from the gap between the response that asked for it and
the request that brought its result (`source: "inferred"`). Claude Code, Codex and Gemini CLI export OpenTelemetry
events with the tool's real duration, outcome and approval decision; received for a session, they replace the
inferred events of the same tool call (`source: "otel"`). Only tool events and event counts come from here: nothing
a CLI sends can touch a reward, a call or another session.

Events read (names and attributes checked against each CLI's source):
- Claude Code `claude_code.tool_result`: tool_name, success ("true"/"false"), duration_ms, error, decision, and the
  tool_use_id where sent; `claude_code.tool_decision`: tool_name, decision, source (code.claude.com/docs,
  "Monitoring usage", events section; Claude Code ships no source).
- Codex `codex.tool_result`: tool_name, call_id, duration_ms, success ("true"/"false"), output (the error, failed);
  `codex.tool_decision`: tool_name, call_id, decision (a ReviewDecision, lower case), source
  (openai/codex codex-rs/otel/src/events/session_telemetry.rs: `tool_result_with_tags`, `log_tool_failed`,
  `tool_decision`).
- Gemini CLI `gemini_cli.tool_call`: function_name, duration_ms, success (bool), decision (accept, reject, modify,
  auto_accept), error (google-gemini/gemini-cli packages/core/src/telemetry/types.ts: `ToolCallEvent`).
- Any span following the GenAI conventions for a tool (`gen_ai.operation.name: execute_tool`, `gen_ai.tool.name`,
  `gen_ai.tool.call.id`), with its own start, end and status.
Every other log record or span is counted by name (the trace's `metadata.telemetry_events`), never dropped unseen.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from hrl.errors import HrlError
from hrl.registry import load

__all__ = [
    "MAX_BODY_BYTES",
    "SIGNALS",
    "ReceivedTools",
    "TelemetryDecodeError",
    "TelemetryUnsupportedError",
    "ToolReport",
    "decode",
    "merge_tools",
    "read",
]

SIGNALS = ("traces", "logs", "metrics")
MAX_BODY_BYTES = 4 * 1024 * 1024  # an export body past this (or past proxy.max_body_bytes, if lower) is a 413
MAX_EVENTS = 4096  # tool events kept per session; more are counted (telemetry_events["dropped"]), not stored
MAX_NAMES = 256  # distinct event names counted per session; others count as "other"
_TOOL_RESULTS = {"claude_code.tool_result": "tool_name", "codex.tool_result": "tool_name",
                 "gemini_cli.tool_call": "function_name"}  # fmt: skip
_DECISIONS = ("claude_code.tool_decision", "codex.tool_decision")
_KNOWN = {*_TOOL_RESULTS, *_DECISIONS}
_EVENT_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")  # claude_code.tool_result, not a tracing message
_CALL_ID_KEYS = ("call_id", "tool_use_id", "tool_call_id", "gen_ai.tool.call.id")
_ACCEPT = {"accept", "auto_accept", "modify", "approved", "approved_for_session", "approved_execpolicy_amendment",
           "allow", "yes"}  # fmt: skip
_REJECT = {"reject", "denied", "deny", "abort", "no", "timed_out"}
_PROTO = {
    "traces": "opentelemetry.proto.collector.trace.v1.trace_service_pb2:ExportTraceServiceRequest",
    "logs": "opentelemetry.proto.collector.logs.v1.logs_service_pb2:ExportLogsServiceRequest",
}


class TelemetryDecodeError(HrlError):
    """An OTLP body that is not what its content type says (answered with a 400)."""


class TelemetryUnsupportedError(HrlError):
    """An OTLP body the proxy cannot read here: an unknown content type, or protobuf without opentelemetry-proto."""


@dataclass(frozen=True)
class ToolReport:
    """One tool call as a CLI reported it: `ended_at` in epoch seconds, `duration_s` what the CLI measured."""

    name: str
    call_id: str
    ended_at: float
    duration_s: float
    ok: bool | None
    decision: str | None = None
    error: str | None = None


# (event name, the tool call it reports, (call id, decision) it decides): one per log record or span
Item = tuple[str, ToolReport | None, tuple[str, str] | None]


@dataclass
class ReceivedTools:
    """A session's received telemetry: the tool reports, the decisions by call id, and every event counted by name."""

    reports: list[ToolReport] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, items: list[Item], since: float) -> None:
        """Take one export's items (`read`) into this session. A report timed outside the session (before
        `since`, or in the future: another clock) is taken as ending when it arrived."""
        now = time.time()
        for name, report, decision in items:
            key = name if name in self.counts or len(self.counts) < MAX_NAMES else "other"
            self.counts[key] += 1
            if report is not None and not since - 1 <= report.ended_at <= now + 1:
                report = replace(report, ended_at=now)
            if report is not None and len(self.reports) < MAX_EVENTS:
                self.reports.append(report)
            elif report is not None:
                self.counts["dropped"] += 1
            elif decision is not None and len(self.decisions) < MAX_EVENTS:
                self.decisions[decision[0]] = decision[1]


def read(signal: str, body: bytes, content_type: str) -> list[Item]:
    """What an OTLP/HTTP export body says, session-free (the server runs it off the event loop)."""
    if signal == "metrics":
        decode(signal, body, content_type)  # the content type is still checked
        return []
    doc = decode(signal, body, content_type)
    items: list[Item] = []
    for name, attrs, at, extra in _log_records(doc) if signal == "logs" else _spans(doc):
        cid = _call_id(attrs)
        decides = (cid, _decision(attrs.get("decision")) or "") if name in _DECISIONS and cid else None
        items.append((name, _tool_report(name, attrs, at, extra), decides))
    return items


# ---- decoding ------------------------------------------------------------------------------------------------------
def decode(signal: str, body: bytes, content_type: str) -> dict[str, Any]:
    """An OTLP/HTTP export body as its OTLP/JSON mapping (camelCase keys). Protobuf needs opentelemetry-proto
    (the `telemetry` extra), imported here on first use; JSON needs nothing."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            doc = json.loads(body or b"{}")
        except ValueError as e:
            raise TelemetryDecodeError(f"OTLP/JSON body is not JSON ({e})") from e
        if not isinstance(doc, dict):
            raise TelemetryDecodeError("OTLP/JSON body must be a JSON object")
        return doc
    if kind != "application/x-protobuf":
        raise TelemetryUnsupportedError(
            f"content type {kind or '(none)'}: send application/x-protobuf or application/json (OTLP/HTTP)"
        )
    if signal == "metrics":
        return {}  # accepted and not read: nothing to decode
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError

        message = load(_PROTO[signal])()
    except ImportError as e:
        raise TelemetryUnsupportedError(
            "OTLP protobuf needs the opentelemetry-proto package: pip install 'hrl[telemetry]' on the proxy's host, "
            "or export OTLP/JSON"
        ) from e
    try:
        message.ParseFromString(body)
    except DecodeError as e:
        raise TelemetryDecodeError(f"OTLP protobuf body does not parse ({e})") from e
    return MessageToDict(message)  # type: ignore[no-any-return]


def _value(v: Any) -> Any:
    """An OTLP AnyValue (`{"stringValue": …}`, …) as a Python value; arrays and maps as compact JSON text."""
    if not isinstance(v, dict) or not v:
        return None
    kind, x = next(iter(v.items()))
    if kind == "intValue":
        try:
            return int(x)
        except (TypeError, ValueError):
            return None
    if kind in ("arrayValue", "kvlistValue", "bytesValue"):
        return json.dumps(x, sort_keys=True)[:2000]
    return x


def _attrs(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {a["key"]: _value(a.get("value")) for a in items if isinstance(a, dict) and isinstance(a.get("key"), str)}


def _seconds(nanos: Any) -> float:
    try:
        return int(nanos) / 1e9
    except (TypeError, ValueError):
        return 0.0


def _list(doc: Any, key: str) -> list[Any]:
    v = doc.get(key) if isinstance(doc, dict) else None
    return v if isinstance(v, list) else []


_Record = tuple[str, dict[str, Any], float, dict[str, Any]]


def _log_records(doc: dict[str, Any]) -> list[_Record]:
    """(event name, attributes, epoch seconds, {}) per log record. The name: whichever of the record's `eventName`,
    a dotted string body (Claude Code's) and its `event.name` attribute (Codex's, Gemini CLI's) is an event hrl
    maps, else the first of them that is set, in that order."""
    out: list[_Record] = []
    for rl in _list(doc, "resourceLogs"):
        for sl in _list(rl, "scopeLogs"):
            for r in _list(sl, "logRecords"):
                if not isinstance(r, dict):
                    continue
                attrs = _attrs(r.get("attributes"))
                body = _value(r.get("body"))
                dotted = body if isinstance(body, str) and _EVENT_NAME.fullmatch(body[:128]) else None
                said = [str(n)[:128] for n in (r.get("eventName"), dotted, attrs.get("event.name")) if n]
                # a name hrl maps wins wherever it is said (Codex's body is its tracing message, "event <file:line>",
                # its name the event.name attribute; Claude Code's body is the name); else the first one said
                name = next((n for n in said if n in _KNOWN), said[0] if said else "unnamed")
                at = _seconds(r.get("timeUnixNano")) or _seconds(r.get("observedTimeUnixNano"))
                out.append((name, attrs, at, {}))
    return out


def _spans(doc: dict[str, Any]) -> list[_Record]:
    """(span name, attributes, end in epoch seconds, {start, error}) per span."""
    out: list[_Record] = []
    for rs in _list(doc, "resourceSpans"):
        for ss in _list(rs, "scopeSpans"):
            for s in _list(ss, "spans"):
                if not isinstance(s, dict):
                    continue
                status = s.get("status") if isinstance(s.get("status"), dict) else {}
                error = status.get("code") in ("STATUS_CODE_ERROR", 2)
                extra = {"start": _seconds(s.get("startTimeUnixNano")), "error": error}
                name = str(s.get("name") or "unnamed")[:128]
                out.append((name, _attrs(s.get("attributes")), _seconds(s.get("endTimeUnixNano")), extra))
    return out


# ---- mapping -------------------------------------------------------------------------------------------------------
def _flag(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def _number(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _decision(v: Any) -> str | None:
    """accept / reject, or the CLI's own word when it is neither (lower case)."""
    if not isinstance(v, str) or not v:
        return None
    word = v.strip().lower()[:64]
    return "accept" if word in _ACCEPT else "reject" if word in _REJECT else word


def _call_id(attrs: dict[str, Any]) -> str:
    return next((str(attrs[k])[:256] for k in _CALL_ID_KEYS if attrs.get(k)), "")


def _tool_report(name: str, attrs: dict[str, Any], at: float, extra: dict[str, Any]) -> ToolReport | None:
    """The tool call a record reports, or None when it reports none."""
    if name in _TOOL_RESULTS:
        tool = attrs.get(_TOOL_RESULTS[name])
        ms = _number(attrs.get("duration_ms"))
        ok = _flag(attrs.get("success"))
        error = attrs.get("error") or attrs.get("error.message") or (attrs.get("output") if ok is False else None)
    elif "start" in extra and attrs.get("gen_ai.operation.name") == "execute_tool":
        tool, ok, error = attrs.get("gen_ai.tool.name"), not extra["error"], None
        ms = max(0.0, at - extra["start"]) * 1000 if extra["start"] else None
    else:
        return None
    if not isinstance(tool, str) or not tool:
        return None
    if tool == "mcp_tool":  # Claude Code hides an MCP tool's name unless its tool details are logged (it sets them)
        tool = _mcp_name(attrs.get("tool_parameters")) or tool
    return ToolReport(
        name=tool[:200],
        call_id=_call_id(attrs),
        ended_at=at,
        duration_s=round((ms or 0.0) / 1000, 3),
        ok=ok,
        decision=_decision(attrs.get("decision")),
        error=str(error)[:500] if error else None,
    )


def _mcp_name(parameters: Any) -> str | None:
    """`mcp__SERVER__TOOL`, as the model called it, from Claude Code's `tool_parameters` (OTEL_LOG_TOOL_DETAILS)."""
    try:
        details = json.loads(parameters) if isinstance(parameters, str) else parameters
        server, tool = details["mcp_server_name"], details["mcp_tool_name"]
    except (ValueError, TypeError, KeyError):
        return None
    return f"mcp__{server}__{tool}" if isinstance(server, str) and isinstance(tool, str) else None


def merge_tools(inferred: list[dict[str, Any]], received: ReceivedTools) -> list[dict[str, Any]]:
    """The session's tool events (epoch seconds): each inferred one marked `source: "inferred"`, and each reported
    one replacing the inferred event of the same call (by call id; else the next unreplaced one of the same tool
    name, in order) or, when there is none, added."""
    out = [{**t, "source": "inferred"} for t in inferred]
    if not received.reports:
        return out
    by_id = {t["tool_call_id"]: i for i, t in enumerate(out) if t.get("tool_call_id")}
    taken: set[int] = set()
    for r in sorted(received.reports, key=lambda r: r.ended_at):
        i = by_id.get(r.call_id) if r.call_id else None
        if i is None or i in taken:
            i = next((j for j, t in enumerate(out) if j not in taken and t["source"] == "inferred"
                      and t["name"] == r.name), None)  # fmt: skip
        call_id = r.call_id or (out[i]["tool_call_id"] if i is not None else "")
        event: dict[str, Any] = {"name": r.name, "tool_call_id": call_id, "started_at": r.ended_at - r.duration_s,
                                 "ended_at": r.ended_at, "source": "otel"}  # fmt: skip
        if r.ok is not None:
            event["status"] = "ok" if r.ok else "error"
        if decision := r.decision or received.decisions.get(call_id):
            event["decision"] = decision
        if r.error and r.ok is False:
            event["error"] = r.error
        if i is None:
            out.append(event)
        else:
            out[i] = event
            taken.add(i)
    return sorted(out, key=lambda t: t["started_at"])
