"""Telemetry in: a CLI's own OTLP/HTTP export to its session replaces the inferred tool events in the trace.

Over real HTTP: a registered session runs one tool call through the proxy (the inferred event), then the tool event
each CLI exports (built with the real opentelemetry-proto classes, or as OTLP/JSON) is posted to the session's
receiver, at the URL and with the headers each runner configures."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb2  # the telemetry extra
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2 as log_records

from hrl.runners.agents.base import AgentContext
from hrl.runners.agents.claude_code import ClaudeCodeRunner
from hrl.runners.agents.codex import CodexRunner
from hrl.runners.agents.gemini_cli import GeminiCliRunner
from hrl.runners.proxy import otel_in
from hrl.runners.trace import read_traces
from tests.proxy_helpers import TOOLS, running_proxy

SCRIPT = [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}, "Done."]
PROTO = {"Content-Type": "application/x-protobuf"}


def _value(v: Any) -> common_pb2.AnyValue:
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    return common_pb2.AnyValue(string_value=str(v))


def _logs(*records: tuple[str, dict[str, Any]], body_name: bool = False) -> bytes:
    """An ExportLogsServiceRequest: one log record per (event name, attributes), stamped now. `body_name`: the name
    in the body (as Claude Code sends it), else in the `event.name` attribute (as Codex and Gemini CLI do)."""
    now = time.time_ns()
    out = []
    for name, attrs in records:
        kv = [common_pb2.KeyValue(key=k, value=_value(v)) for k, v in attrs.items()]
        if body_name:
            out.append(log_records.LogRecord(time_unix_nano=now, body=common_pb2.AnyValue(string_value=name),
                                             attributes=kv))  # fmt: skip
        else:
            kv.append(common_pb2.KeyValue(key="event.name", value=_value(name)))
            # Codex's body is its tracing message, which names the source line (seen from codex 0.171), not the event
            message = common_pb2.AnyValue(string_value="event otel/src/events/session_telemetry.rs:737")
            out.append(log_records.LogRecord(time_unix_nano=now, body=message, attributes=kv))
    scope = log_records.ScopeLogs(log_records=out)
    msg = logs_pb2.ExportLogsServiceRequest(resource_logs=[log_records.ResourceLogs(scope_logs=[scope])])
    return msg.SerializeToString()


def _session(p: Any) -> str:
    r = httpx.post(f"{p.url}/sessions", json={}, headers=p.control)
    assert r.status_code == 201
    return str(r.json()["token"])


def _tool_turn(p: Any, token: str) -> str:
    """One tool call through the proxy and its result back: the session's inferred `bash` event. Its call id."""
    url, msgs = f"{p.url}/s/{token}/v1/chat/completions", [{"role": "user", "content": "list"}]
    reply = httpx.post(url, json={"model": "m", "messages": msgs, "tools": TOOLS[:1]}).json()["choices"][0]["message"]
    (tc,) = reply["tool_calls"]
    msgs += [reply, {"role": "tool", "tool_call_id": tc["id"], "content": "a.py"}]
    assert httpx.post(url, json={"model": "m", "messages": msgs, "tools": TOOLS[:1]}).status_code == 200
    return str(tc["id"])


def _end(p: Any, token: str, out: Any) -> dict[str, Any]:
    assert httpx.post(f"{p.url}/s/{token}/end", json={"reward": 0.5}, headers=p.control).status_code == 200
    return next(t for t in read_traces(out) if t["session"] == token)


def _ctx(p: Any, token: str, telemetry: bool = True) -> AgentContext:
    return AgentContext(base_url=f"{p.url}/s/{token}", api_key=f"hrl-{token}", model="m", prompt="p", home="/h",
                        workdir="/w", install_dir="/i", options={} if telemetry else {"telemetry": False})  # fmt: skip


def _headers(pairs: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS (`k=v,k2=v2`) as headers."""
    return dict(pair.split("=", 1) for pair in pairs.split(","))


def _codex_post(ctx: AgentContext, call_id: str) -> httpx.Response:
    """Codex's `codex.tool_result` (success as "true"/"false", duration_ms as text: codex formats both with
    Display), sent where and how its config.toml says, after a `codex.tool_decision` for the same call."""
    (exporter,) = tomllib.loads(CodexRunner().files(ctx)[".codex/config.toml"])["otel"]["exporter"].values()
    assert exporter["protocol"] == "binary"
    body = _logs(
        ("codex.tool_decision", {"tool_name": "bash", "call_id": call_id, "decision": "approved", "source": "config"}),
        ("codex.tool_result", {"tool_name": "bash", "call_id": call_id, "duration_ms": "1250", "success": "false",
                               "output": "exit 2"}),
        ("codex.sse_event", {"event.kind": "response.completed"}),
    )  # fmt: skip
    return httpx.post(exporter["endpoint"], content=body, headers={**exporter["headers"], **PROTO})


def _claude_post(ctx: AgentContext, call_id: str) -> httpx.Response:
    """Claude Code's `claude_code.tool_result` (its name in the body), where its OTEL_* environment says."""
    env = ClaudeCodeRunner().env(ctx)
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf" and env["OTEL_LOGS_EXPORTER"] == "otlp"
    body = _logs(
        ("claude_code.tool_result", {"event.name": "tool_result", "tool_name": "bash", "success": "false",
                                     "duration_ms": 1250, "decision": "accept", "error": "exit 2"}),
        ("claude_code.api_request", {"event.name": "api_request", "duration_ms": 80}),
        body_name=True,
    )  # fmt: skip
    url = f"{env['OTEL_EXPORTER_OTLP_ENDPOINT']}/v1/logs"  # what the SDK does with a base endpoint
    return httpx.post(url, content=body, headers={**_headers(env["OTEL_EXPORTER_OTLP_HEADERS"]), **PROTO})


def _gemini_post(ctx: AgentContext, call_id: str) -> httpx.Response:
    """Gemini CLI's `gemini_cli.tool_call` (success a bool, duration_ms a number), where its settings say."""
    runner = GeminiCliRunner()
    telemetry = json.loads(runner.files(ctx)[".gemini/settings.json"])["telemetry"]
    assert telemetry["enabled"] and telemetry["target"] == "local" and telemetry["otlpProtocol"] == "http"
    body = _logs(
        ("gemini_cli.tool_call", {"function_name": "bash", "duration_ms": 1250, "success": False,
                                  "decision": "auto_accept", "error": "exit 2"}),
        ("gemini_cli.api_response", {"duration_ms": 80}),
    )  # fmt: skip
    url = f"{telemetry['otlpEndpoint']}/v1/logs"  # sdk.ts joins the endpoint's path and v1/logs
    return httpx.post(url, content=body, headers={**_headers(runner.env(ctx)["OTEL_EXPORTER_OTLP_HEADERS"]), **PROTO})


# Each CLI's export, and an event of it that is not a tool's. Their decisions (approved, accept, auto_accept) all
# read as accept.
CASES = [(_codex_post, "codex.sse_event"), (_claude_post, "claude_code.api_request"),
         (_gemini_post, "gemini_cli.api_response")]  # fmt: skip


@pytest.mark.parametrize(("post", "other"), CASES)
def test_each_cli_export_replaces_the_inferred_tool_event(tiny_model, tmp_path, post, other):
    out = tmp_path / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}, open_sessions=False) as p:
        token = _session(p)
        call_id = _tool_turn(p, token)
        r = post(_ctx(p, token), call_id)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("application/x-protobuf")
        trace = _end(p, token, out)
    (event,) = trace["tools"]  # replaced, not added beside the inferred one
    assert (event["name"], event["tool_call_id"], event["source"]) == ("bash", call_id, "otel")
    assert (event["status"], event["decision"], event["error"]) == ("error", "accept", "exit 2")
    # 1.25 s reported; each end is rounded to the millisecond in the trace, so the difference is within 2 ms
    assert abs(event["ended_at"] - event["started_at"] - 1.25) <= 0.002
    assert trace["metadata"]["telemetry_events"][other] == 1  # an event that is not a tool's: counted, not dropped
    assert trace["reward"] == 0.5 and len(trace["calls"]) == 2


def test_otlp_json_logs_and_a_genai_span_without_a_match_are_added(tiny_model, tmp_path):
    out = tmp_path / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}, open_sessions=False) as p:
        token = _session(p)
        _tool_turn(p, token)
        key, now = {"x-api-key": f"hrl-{token}"}, time.time_ns()
        logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": str(now), "attributes": [
            {"key": "event.name", "value": {"stringValue": "gemini_cli.tool_call"}},
            {"key": "function_name", "value": {"stringValue": "bash"}},
            {"key": "duration_ms", "value": {"intValue": "400"}},
            {"key": "success", "value": {"boolValue": True}}]}]}]}]}  # fmt: skip
        r = httpx.post(f"{p.url}/s/{token}/v1/logs", json=logs, headers=key)
        assert (r.status_code, r.json()) == (200, {})
        span = {"name": "execute_tool read_file", "startTimeUnixNano": str(now - 300_000_000),
                "endTimeUnixNano": str(now), "status": {"code": 2}, "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                    {"key": "gen_ai.tool.name", "value": {"stringValue": "read_file"}}]}  # fmt: skip
        traces = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
        assert httpx.post(f"{p.url}/s/{token}/v1/traces", json=traces, headers=key).status_code == 200
        r = httpx.post(f"{p.url}/s/{token}/v1/metrics", content=b"\x00\x01", headers={**key, **PROTO})
        assert r.status_code == 200  # accepted and not read: an exporter does not retry it
        trace = _end(p, token, out)
    by_name = {t["name"]: t for t in trace["tools"]}
    assert [t["source"] for t in trace["tools"]] == ["otel", "otel"]
    assert by_name["bash"]["status"] == "ok" and abs(by_name["bash"]["ended_at"] - by_name["bash"]["started_at"]
                                                      - 0.4) <= 0.002  # fmt: skip
    assert (by_name["read_file"]["tool_call_id"], by_name["read_file"]["status"]) == ("", "error")
    assert trace["metadata"]["telemetry_events"] == {"gemini_cli.tool_call": 1, "execute_tool read_file": 1}


def test_without_telemetry_tool_events_say_they_are_inferred(tiny_model, tmp_path):
    out = tmp_path / "traces.jsonl"
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}, open_sessions=False) as p:
        token = _session(p)
        _tool_turn(p, token)
        trace = _end(p, token, out)
    assert [(t["name"], t["source"]) for t in trace["tools"]] == [("bash", "inferred")]
    assert "telemetry_events" not in trace["metadata"]


def test_keys_sessions_and_sizes_are_checked_like_the_model_routes(tiny_model, tmp_path):
    out = tmp_path / "traces.jsonl"
    body = _logs(("codex.tool_result", {"tool_name": "bash", "duration_ms": "5", "success": "true"}))
    with running_proxy(tiny_model, traces=str(out), engine_options={"turns": SCRIPT}, open_sessions=False,
                       max_body_bytes=4096) as p:  # fmt: skip
        a, b = _session(p), _session(p)
        url = f"{p.url}/s/{b}/v1/logs"
        assert httpx.post(url, content=body, headers=PROTO).status_code == 401  # no key
        assert httpx.post(url, content=body, headers={**PROTO, "x-api-key": "hrl-wrong"}).status_code == 401
        assert httpx.post(url, content=body, headers={**PROTO, "x-api-key": f"hrl-{a}"}).status_code == 401  # a's
        assert httpx.post(url, content=body, headers={**PROTO, "Authorization": f"Bearer hrl-{b}"}).status_code == 200
        gone = "x" * 22  # a session no proxy opened, with its own key: not found
        r = httpx.post(f"{p.url}/s/{gone}/v1/logs", content=body, headers={**PROTO, "x-api-key": f"hrl-{gone}"})
        assert r.status_code == 404
        # the cap is proxy.max_body_bytes here (below otel_in.MAX_BODY_BYTES): one byte over it is refused
        r = httpx.post(url, content=b"\x00" * 4097, headers={**PROTO, "x-api-key": f"hrl-{b}"})
        assert r.status_code == 413
        r = httpx.post(url, content=b"\xff\xff\xff", headers={**PROTO, "x-api-key": f"hrl-{b}"})
        assert r.status_code == 400  # not an OTLP protobuf message
        assert httpx.post(url, content=b"{}", headers={"x-api-key": f"hrl-{b}",
                                                        "Content-Type": "text/plain"}).status_code == 415  # fmt: skip
        trace_a, trace_b = _end(p, a, out), _end(p, b, out)
        r = httpx.post(url, content=body, headers={**PROTO, "x-api-key": f"hrl-{b}"})
        assert r.status_code == 404  # ended: its trace is written and nothing joins it any more
    assert "telemetry_events" not in trace_a["metadata"] and trace_a["tools"] == []
    assert trace_b["metadata"]["telemetry_events"] == {"codex.tool_result": 1}
    assert trace_b["tools"][0]["source"] == "otel"
    assert trace_b["metadata"]["reward_without_calls"] == 0.5  # no model call: the owner's reward kept aside


def test_protobuf_without_opentelemetry_proto_is_a_clear_415_and_json_still_reads(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.logs.v1.logs_service_pb2", None)
    with pytest.raises(otel_in.TelemetryUnsupportedError, match=r"pip install 'hrl\[telemetry\]'"):
        otel_in.decode("logs", b"", "application/x-protobuf")
    assert otel_in.decode("logs", b'{"resourceLogs": []}', "application/json; charset=utf-8") == {"resourceLogs": []}


def test_turned_off_each_runner_exports_nothing():
    ctx = AgentContext(base_url="http://127.0.0.1:1/s/t", api_key="hrl-t", model="m", prompt="p", home="/h",
                       workdir="/w", install_dir="/i", options={"telemetry": False})  # fmt: skip
    assert tomllib.loads(CodexRunner().files(ctx)[".codex/config.toml"])["otel"]["exporter"] == "none"
    assert not any(k.startswith(("OTEL_", "CLAUDE_CODE_ENABLE_TELEMETRY")) for k in ClaudeCodeRunner().env(ctx))
    gemini = GeminiCliRunner()
    assert json.loads(gemini.files(ctx)[".gemini/settings.json"])["telemetry"] == {"enabled": False}
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in gemini.env(ctx)


def test_a_session_keeps_bounded_counts_and_reads_foreign_clocks_as_arrival():
    received, now = otel_in.ReceivedTools(), time.time()
    late = otel_in.ToolReport("bash", "c1", ended_at=now + 3600, duration_s=0.5, ok=True)  # an hour ahead: a bad clock
    names = [(f"x.event{i}", None, None) for i in range(otel_in.MAX_NAMES + 10)]
    received.add([("codex.tool_result", late, None), *names], since=now - 5)
    assert received.reports[0].ended_at <= time.time()  # taken as ending when it arrived, not an hour on
    assert len(received.counts) == otel_in.MAX_NAMES + 1  # 256 names, then the 11 beyond them as "other"
    assert received.counts["other"] == 11
    inferred = [{"name": "bash", "tool_call_id": "c0", "started_at": now - 3, "ended_at": now - 2},
                {"name": "bash", "tool_call_id": "c1", "started_at": now - 2, "ended_at": now - 1}]  # fmt: skip
    merged = otel_in.merge_tools(inferred, received)
    assert [(t["tool_call_id"], t["source"]) for t in merged] == [("c0", "inferred"), ("c1", "otel")]  # by call id


def test_claude_codes_mcp_tool_is_named_as_the_model_called_it():
    """Claude Code reports every MCP tool as `mcp_tool`; with its tool details logged (hrl sets
    OTEL_LOG_TOOL_DETAILS), `tool_parameters` names the server and the tool: the event says `mcp__SERVER__TOOL`."""
    details = json.dumps({"mcp_server_name": "playwright", "mcp_tool_name": "browser_click"})
    body = _logs(("claude_code.tool_result", {"tool_name": "mcp_tool", "tool_parameters": details, "success": "true",
                                              "duration_ms": "12", "tool_use_id": "toolu_1"}),
                 ("claude_code.tool_result", {"tool_name": "mcp_tool", "success": "true", "tool_use_id": "toolu_2"}),
                 body_name=True)  # fmt: skip
    names = [report.name for _, report, _ in otel_in.read("logs", body, "application/x-protobuf") if report]
    assert names == ["mcp__playwright__browser_click", "mcp_tool"]  # without details: as reported
