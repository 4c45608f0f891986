"""OpenTelemetry out (runners/telemetry/otlp.py): a real OTLP/HTTP receiver in the test gets each written trace as an
episode span with its model-call and tool spans, `gen_ai.*` and `rl.*` attributes, the trace's own times and no
token ids; an unreachable collector costs a warning and a count, never the run; with no endpoint the SDK is not even
imported."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import opentelemetry.sdk  # noqa: F401  # the telemetry extra, which .ci/setup.sh installs: a missing one fails here
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hrl.runners.errors import PrerequisiteError
from hrl.runners.rollouts.episodes import Episode, Rollouts, guarded_episode
from hrl.runners.telemetry.otlp import TelemetryConfig, export_step, exporting
from hrl.runners.trace import TraceWriter, read_traces

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "chat-sse.jsonl"  # 5 calls (one side), 2 tool events


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


class Receiver:
    """A minimal OTLP/HTTP collector: POST /v1/traces with a protobuf body; keeps every span as a dict."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.take(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            self.resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append({"name": s.name, "id": s.span_id, "parent": s.parent_span_id,
                                       "trace": s.trace_id, "kind": s.kind, "start": s.start_time_unix_nano,
                                       "end": s.end_time_unix_nano, "status": s.status.code, "attributes": attrs})  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _golden() -> dict[str, Any]:
    (trace,) = read_traces(GOLDEN)
    meta = {**trace["metadata"], "episode": "it3:calc-000#1", "run": "hrl-otlp"}
    return {**trace, "task_id": "calc-000", "group_id": "g1", "model": {"name": "tiny"}, "success": True,
            "agent": {"name": "agent.py:run", "version": "subprocess"}, "metadata": meta}  # fmt: skip


def _no_token_ids(spans: list[dict[str, Any]], trace: dict[str, Any]) -> None:
    """No attribute holds a call's ids: the only int arrays are policy versions (≤ the versions a trace has)."""
    versions = {v for c in trace["calls"] for _, v in c["versions"]}
    ids = [c.get(k) for c in trace["calls"] for k in ("prompt_ids", "prompt_suffix_ids", "response_ids") if c.get(k)]
    for s in spans:
        for key, value in s["attributes"].items():
            if isinstance(value, list):
                assert value not in ids and len(value) <= len(versions), (s["name"], key)
            assert str(ids[0][:4])[1:-1] not in str(value), (s["name"], key)


def test_a_written_trace_reaches_the_collector_as_an_episode_with_call_and_tool_spans(receiver, tmp_path):
    """A trace written to a run's traces/iter-0003.jsonl: the episode span (rl.step 3, reward, success, versions,
    staleness from the last step's version), five chat spans with gen_ai.* and two execute_tool spans, each
    at the times the trace recorded; then a step span with the step's metrics."""
    trace = _golden()
    cfg = TelemetryConfig(otlp_endpoint=receiver.url, export_timeout_s=5)
    lines: list[str] = []
    with exporting(cfg, run_id="hrl-otlp", provider="scripted", say=lines.append) as exporter:
        assert exporter is not None
        many = {f"routing/r{i}/prefix_hit_rate": i / 200 for i in range(200)}  # past the SDK's default 128 attributes
        export_step({"train/version": 1, "version": 2, "trace/reward": 0.5, "train/empty": False, **many}, step=2)
        writer = TraceWriter(tmp_path / "traces" / "iter-0003.jsonl", redactor=False, export=exporter.export_written)
        writer.write(trace)
    assert lines == [f"OTLP: 9 spans sent to {receiver.url}/v1/traces, 0 dropped"], lines
    assert list(read_traces(tmp_path / "traces" / "iter-0003.jsonl")) == [trace]  # written as ever
    assert receiver.resources[0]["service.name"] == "hrl" and receiver.resources[0]["rl.run"] == "hrl-otlp"

    [step] = [s for s in receiver.spans if s["name"] == "rl.step 2"]
    assert step["attributes"] == {
        "rl.run": "hrl-otlp",
        "rl.step": 2,
        "rl.metric.train/version": 1.0,
        "rl.metric.version": 2.0,
        "rl.metric.trace/reward": 0.5,
        **{f"rl.metric.{k}": v for k, v in many.items()},
    }  # train/empty, a bool, is no metric
    [episode] = [s for s in receiver.spans if s["name"] == "invoke_agent agent.py:run"]
    a = episode["attributes"]
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "agent.py:run"
    assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.provider.name"] == a["gen_ai.system"] == "scripted"
    assert (a["rl.run"], a["rl.phase"], a["rl.step"], a["rl.task"], a["rl.group"]) == ("hrl-otlp", "train", 3,
                                                                                       "calc-000", "g1")  # fmt: skip
    assert (a["rl.reward"], a["rl.success"], a["rl.status"], a["rl.turns"]) == (1.0, True, "ok", 4)
    assert a["rl.policy_versions"] == [0, 1] and a["rl.policy_version.min"] == 0 and a["rl.policy_version.max"] == 1
    assert a["rl.staleness"] == 2  # the trainer's version 2 (after the step logged before) − the oldest token's 0
    assert a["rl.trace_id"] == trace["trace_id"] and a["rl.episode"] == "it3:calc-000#1"
    assert "rl.failure_reason" not in a and "session" not in json.dumps(a)
    assert (episode["start"], episode["end"]) == (round(trace["started_at"] * 1e9), round(trace["ended_at"] * 1e9))

    assert episode["trace"].hex() == trace["trace_id"]  # the OTLP trace id is the hrl one: a span finds its file
    children = [s for s in receiver.spans if s["parent"] == episode["id"]]
    assert all(s["trace"] == episode["trace"] for s in children)
    chats = [s for s in children if s["name"] == "chat tiny"]
    tools = [s for s in children if s["name"] == "execute_tool bash"]
    assert len(chats) == len(trace["calls"]) == 5 and len(tools) == len(trace["tools"]) == 2
    assert len(children) == 7
    by_id = {s["attributes"]["gen_ai.response.id"]: s for s in chats}
    for call in trace["calls"]:
        s = by_id[call["call_id"]]
        c = s["attributes"]
        assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.request.model"] == c["gen_ai.response.model"]
        assert s["kind"] == Span.SPAN_KIND_CLIENT  # GenAI conventions: a model call is a client span
        assert c["gen_ai.usage.output_tokens"] == len(call["response_ids"])
        prompt = len(call["prompt_ids"]) if "prompt_ids" in call else (
            call["prompt_ref"]["length"] + len(call["prompt_suffix_ids"]))  # fmt: skip
        assert c["gen_ai.usage.input_tokens"] == prompt
        assert c["gen_ai.response.finish_reasons"] == [call["finish_reason"]] and c["rl.call.side"] == call["side"]
        t0 = trace["started_at"]
        assert (s["start"], s["end"]) == (round((t0 + call["started_at"]) * 1e9), round((t0 + call["ended_at"]) * 1e9))
    assert by_id["c5-4c5c60"]["attributes"]["rl.policy_versions"] == [0, 1]  # sampled across a publish
    assert a["gen_ai.usage.output_tokens"] == sum(len(c["response_ids"]) for c in trace["calls"])
    for s, event in zip(sorted(tools, key=lambda s: s["start"]), trace["tools"], strict=True):
        assert s["attributes"] == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                                   "gen_ai.tool.call.id": event["tool_call_id"]}  # fmt: skip
        assert s["start"] == round((trace["started_at"] + event["started_at"]) * 1e9)
    _no_token_ids(receiver.spans, trace)


class _Raising(Rollouts):
    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        raise RuntimeError("a bug in the runner")


def test_only_a_writer_given_the_export_sends_and_rollouts_hand_theirs_to_every_trace(receiver, tmp_path):
    """No process-wide hook: a writer exports what it is given the exporter for, and nothing else; an episode that
    raises becomes an internal_error trace that goes where its rollouts' `export` says, like any other."""
    with exporting(TelemetryConfig(otlp_endpoint=receiver.url)) as exporter:
        assert exporter is not None
        TraceWriter(tmp_path / "quiet.jsonl", redactor=False).write(_golden())  # no export given: none
        rollouts = _Raising()
        rollouts.export = exporter.export_written
        trace = asyncio.run(guarded_episode(rollouts, Episode({"instance_id": "t1"}, 0, 3), tmp_path / "t.jsonl"))
    assert trace["failure_reason"] == "internal_error" and list(read_traces(tmp_path / "t.jsonl")) == [trace]
    [episode] = receiver.spans
    assert episode["trace"].hex() == trace["trace_id"]
    assert episode["attributes"]["rl.failure_reason"] == "internal_error"


def _refusing_port() -> socket.socket:
    """A bound socket that never listens: connecting to its port is refused, and no one else can take the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def _silent_port() -> socket.socket:
    """A listening socket that never answers: an export request waits out its timeout."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


@pytest.mark.parametrize("make", [_refusing_port, _silent_port], ids=["refused", "silent"])
def test_an_unreachable_collector_costs_one_warning_and_a_count_never_the_trace(make, tmp_path):
    sock = make()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    trace = _golden()
    lines: list[str] = []
    try:
        with exporting(TelemetryConfig(otlp_endpoint=url, export_timeout_s=1), say=lines.append) as exporter:
            assert exporter is not None
            for _ in range(2):
                TraceWriter(tmp_path / "t.jsonl", redactor=False, export=exporter.export_written).write(trace)
    finally:
        sock.close()
    assert list(read_traces(tmp_path / "t.jsonl")) == [trace, trace]
    assert exporter is not None and exporter.exported == 0
    assert exporter.dropped == 2 * (1 + len(trace["calls"]) + len(trace["tools"]))  # every span, counted
    [warning, summary] = lines
    assert warning.startswith(f"OTLP export to {url}/v1/traces failed") and "the run goes on" in warning
    assert summary == f"OTLP: 0 spans sent to {url}/v1/traces, {exporter.dropped} dropped"


def test_without_an_endpoint_nothing_is_exported_and_the_sdk_is_not_imported(tmp_path):
    code = (
        "import sys\n"
        "from hrl.runners.placement import RunConfig\n"
        "from hrl.runners.telemetry.otlp import exporting\n"
        "from hrl.runners.trace import TraceWriter, read_traces\n"
        f"(t,) = read_traces({str(GOLDEN)!r})\n"
        "with exporting(RunConfig().telemetry) as e:\n"
        f"    TraceWriter({str(tmp_path / 't.jsonl')!r}, export=e.export_written if e else None).write(t)\n"
        "print(e, sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk') or 'otlp.proto' in m))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None []"


def test_the_standard_env_var_is_the_endpoint_when_none_is_given(receiver, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    with exporting(TelemetryConfig()) as exporter:
        assert exporter is not None and exporter.url == f"{receiver.url}/v1/traces"
        TraceWriter(tmp_path / "t.jsonl", redactor=False, export=exporter.export_written).write(_golden())
    assert len(receiver.spans) == 8


def test_an_endpoint_without_the_sdk_is_a_prerequisite_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # what an install without the extra sees
    with pytest.raises(PrerequisiteError) as e, exporting(TelemetryConfig(otlp_endpoint="http://127.0.0.1:1")):
        pass
    assert "hrl[telemetry]" in (e.value.hint or "")


@pytest.mark.timeout(300)
def test_hrl_rollout_with_otlp_sends_the_episode(receiver, tmp_path):
    """`hrl rollout --otlp URL`, a white-box agent on the scripted engine (one tool call, then the answer): the
    collector gets the episode with its two chat spans and its tool span; the trace file is as without export."""
    turns = json.dumps([{"tool_calls": [{"name": "calculator", "arguments": {"expression": "98 - 30"}}]}, "68"])
    cmd = [sys.executable, "-m", "hrl.cli", "rollout", "--recipe", "langgraph-react", "--model", "hrl:tiny",
           "--engine", "scripted", "-c", f"engine_options.turns={turns}", "--limit", "1", "--out", "t.jsonl",
           "--run-id", "hrl-otlp-cli", "--otlp", receiver.url]  # fmt: skip
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [trace] = list(read_traces(tmp_path / "t.jsonl"))
    assert f"OTLP: 4 spans sent to {receiver.url}/v1/traces, 0 dropped" in out.stderr, out.stderr
    [episode] = [s for s in receiver.spans if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"]
    a = episode["attributes"]
    assert a["rl.run"] == "hrl-otlp-cli" and a["rl.task"] == "calc-000" and a["rl.reward"] == trace["reward"]
    assert a["gen_ai.provider.name"] == "scripted" and "rl.step" not in a  # a rollout has no training step
    chats = [s for s in receiver.spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    [tool] = [s for s in receiver.spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool"]
    assert len(chats) == len(trace["calls"]) == 2 and tool["attributes"]["gen_ai.tool.name"] == "calculator"
    assert all(s["parent"] == episode["id"] for s in [*chats, tool])
    assert [s["attributes"]["gen_ai.usage.output_tokens"] for s in sorted(chats, key=lambda s: s["start"])] == [
        len(c["response_ids"]) for c in trace["calls"]
    ]
    _no_token_ids(receiver.spans, trace)
