"""OpenTelemetry out: each written trace as an episode span with one child span per model call and per tool
event, and each training step as a span, sent over OTLP/HTTP through the official SDK (docs/telemetry.md).

    with exporting(run.telemetry, run_id="hrl-1a2b", provider="vllm"):
        ...  # every TraceWriter.write in this process now exports the trace it wrote

Attributes follow the OpenTelemetry GenAI semantic conventions (`gen_ai.*`) plus `rl.*` for what RL adds (run,
step, task, reward, success, policy versions, staleness). Token ids never go into a span. A span starts and ends
at the times the trace recorded, not when it is exported.

The SDK is imported only when an endpoint is set; with none, `exporting` does nothing and costs nothing. Export
runs on the SDK's BatchSpanProcessor thread: an unreachable collector costs one warning and a count of dropped
spans, never a failed or stalled run.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.errors import PrerequisiteError

__all__ = ["OtlpExporter", "TelemetryConfig", "episode_spans", "export_step", "export_written", "exporting"]

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
PIP_HINT = "pip install 'hrl[telemetry]' (opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
RETRY_AFTER_S = 30.0  # after a failed export, batches are dropped (counted) this long instead of waiting on a dead host


class TelemetryConfig(BaseModel):
    """The recipe's `telemetry:` section (`--otlp URL` sets `otlp_endpoint`)."""

    model_config = ConfigDict(extra="forbid")

    otlp_endpoint: str = Field(
        "",
        description="OTLP/HTTP collector base URL (http://host:4318; /v1/traces is added); empty = "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, and with that unset nothing is exported.",
    )
    service_name: str = Field("hrl", description="The `service.name` resource attribute.")
    export_timeout_s: float = Field(5.0, gt=0, description="Seconds one export request may take.")


# ---- trace → span dicts ------------------------------------------------------------------------------------

_STEP_FILE = re.compile(r"(iter|step)-(\d+)(?:\.[a-z]+)?\.jsonl$")
Span = dict[str, Any]  # {name, start_ns, end_ns, attributes, error, children}


def _ns(epoch_s: float) -> int:
    return round(epoch_s * 1e9)


def _prompt_len(call: dict[str, Any]) -> int:
    if "prompt_ids" in call:
        return len(call["prompt_ids"])
    return int(call["prompt_ref"]["length"]) + len(call.get("prompt_suffix_ids") or [])


def _versions(call: dict[str, Any]) -> list[int]:
    return sorted({int(v) for _, v in call.get("versions") or []}) if call.get("response_ids") else []


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes OTel can hold: None dropped (absent, not null), lists kept homogeneous."""
    return {k: v for k, v in attrs.items() if v is not None and v != []}


def step_of(source: str | Path | None) -> tuple[str | None, int | None]:
    """(phase, step) read from a run directory's trace file name: traces/iter-0003.jsonl is step 3 of training,
    eval/step-0002.jsonl the held-out evaluation before step 2; any other file: (None, None)."""
    m = _STEP_FILE.search(Path(source).name) if source else None
    if not m:
        return None, None
    return ("train" if m.group(1) == "iter" else "eval"), int(m.group(2))


def _call_span(trace: dict[str, Any], call: dict[str, Any], t0: float, model: str | None, provider: str) -> Span:
    versions = _versions(call)
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.response.id": call["call_id"],
        "gen_ai.response.finish_reasons": [str(call["finish_reason"])],
        "gen_ai.usage.input_tokens": _prompt_len(call),
        "gen_ai.usage.output_tokens": len(call["response_ids"]),
        "gen_ai.agent.name": call.get("agent"),
        "rl.call.dialect": call.get("dialect"),
        "rl.call.stream": call.get("stream"),
        "rl.call.side": call.get("side"),
        "rl.call.first_token_s": call.get("first_token_at", 0.0) - call.get("started_at", 0.0),
        "rl.policy_versions": versions,
        "rl.policy_version.min": versions[0] if versions else None,
        "rl.policy_version.max": versions[-1] if versions else None,
        "error.type": "engine_error" if call.get("error") else None,
    }
    return {
        "name": f"chat {model}" if model else "chat",
        "start_ns": _ns(t0 + float(call["started_at"])),
        "end_ns": _ns(t0 + float(call["ended_at"])),
        "attributes": _clean(attrs),
        "error": call.get("error"),
        "children": [],
    }


def _tool_span(tool: dict[str, Any], t0: float) -> Span:
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool.get("name"),
        "gen_ai.tool.call.id": tool.get("tool_call_id"),
    }
    return {
        "name": f"execute_tool {tool.get('name', '')}".strip(),
        "start_ns": _ns(t0 + float(tool["started_at"])),
        "end_ns": _ns(t0 + float(tool["ended_at"])),
        "attributes": _clean(attrs),
        "error": None,
        "children": [],
    }


def episode_spans(
    trace: dict[str, Any],
    *,
    run_id: str = "",
    step: int | None = None,
    phase: str | None = None,
    trainer_version: int | None = None,
    provider: str = "hrl",
) -> Span:
    """One trace as an episode span dict with its model-call and tool children. Counts of tokens, never ids."""
    t0 = float(trace["started_at"])
    model = (trace.get("model") or {}).get("name") or None
    calls = [_call_span(trace, c, t0, model, provider) for c in trace["calls"]]
    tools = [_tool_span(t, t0) for t in trace.get("tools") or []]
    versions = sorted({v for c in trace["calls"] for v in _versions(c)})
    meta = trace.get("metadata") or {}
    success = trace.get("success")
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": (trace.get("agent") or {}).get("name"),
        "gen_ai.request.model": model,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.usage.input_tokens": sum(c["attributes"]["gen_ai.usage.input_tokens"] for c in calls),
        "gen_ai.usage.output_tokens": sum(c["attributes"]["gen_ai.usage.output_tokens"] for c in calls),
        "rl.run": str(meta.get("run") or run_id) or None,
        "rl.phase": phase,
        "rl.step": step,
        "rl.task": trace.get("task_id"),
        "rl.group": trace.get("group_id"),
        "rl.episode": meta.get("episode"),
        "rl.trace_id": trace["trace_id"],
        "rl.agent.version": (trace.get("agent") or {}).get("version"),
        "rl.env.version": None if (ev := (trace.get("env") or {}).get("version")) is None else str(ev),
        "rl.status": trace["status"],
        "rl.failure_reason": trace.get("failure_reason"),
        "rl.reward": None if trace.get("reward") is None else float(trace["reward"]),
        "rl.success": success if isinstance(success, bool) else None,
        "rl.turns": sum(1 for c in trace["calls"] if not c.get("side")),
        "rl.policy_versions": versions,
        "rl.policy_version.min": versions[0] if versions else None,
        "rl.policy_version.max": versions[-1] if versions else None,
        "rl.staleness": trainer_version - versions[0] if trainer_version is not None and versions else None,
        "error.type": trace.get("failure_reason"),
    }
    return {
        "name": f"invoke_agent {attrs['gen_ai.agent.name']}" if attrs["gen_ai.agent.name"] else "invoke_agent",
        "start_ns": _ns(t0),
        "end_ns": _ns(float(trace["ended_at"])),
        "attributes": _clean(attrs),
        "error": trace.get("failure_reason"),
        "children": sorted(calls + tools, key=lambda s: s["start_ns"]),
    }


def step_span(metrics: dict[str, Any], step: int, start_s: float, end_s: float, run_id: str) -> Span:
    """A training step as a span: `rl.step`, `rl.run` and every finite numeric metric as `rl.metric.<name>`."""
    numbers = {
        f"rl.metric.{k}": float(v)
        for k, v in metrics.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    }
    attrs = {"rl.run": run_id or None, "rl.step": step, **numbers}
    return {"name": f"rl.step {step}", "start_ns": _ns(start_s), "end_ns": _ns(end_s), "attributes": _clean(attrs),
            "error": None, "children": []}  # fmt: skip


# ---- the SDK -----------------------------------------------------------------------------------------------


def _sdk() -> Any:
    """The SDK modules, imported on first use; PrerequisiteError with the pip line when they are missing."""
    try:
        from opentelemetry import trace as api
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError as e:
        raise PrerequisiteError(f"OTLP export needs the OpenTelemetry SDK ({e})", hint=PIP_HINT) from None
    return api, OTLPSpanExporter, Resource, TracerProvider, BatchSpanProcessor, SpanExporter, SpanExportResult


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a base endpoint, as the SDK reads OTEL_EXPORTER_OTLP_ENDPOINT."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class OtlpExporter:
    """Span dicts → SDK spans → a BatchSpanProcessor → OTLP/HTTP. `exported` / `dropped` count spans; `warn` is
    called once, from the export thread, the first time a batch cannot be delivered."""

    def __init__(
        self,
        endpoint: str,
        *,
        run_id: str = "",
        provider: str = "hrl",
        service_name: str = "hrl",
        timeout_s: float = 5.0,
        warn: Callable[[str], object] = lambda _: None,
        phase: str | None = None,
    ) -> None:
        api, otlp, resource, tracer_provider, batch, base, result = _sdk()
        logging.getLogger("opentelemetry").addHandler(logging.NullHandler())  # our one warning, not the SDK's
        self.url, self.run_id, self.provider, self._api = traces_url(endpoint), run_id, provider, api
        self.phase = phase  # None: read from each trace file's name (step_of)
        self.exported = self.dropped = 0
        self.trainer_version: int | None = None
        self._warn, self._warned, self._down_until = warn, False, 0.0
        self._lock = threading.Lock()
        self._last_step_s = time.time()
        inner = otlp(endpoint=self.url, timeout=timeout_s)
        outer = self

        class Counting(base):  # a SpanExporter: delivery counted, a dead collector skipped for RETRY_AFTER_S
            def export(self, spans: Sequence[Any]) -> Any:
                return outer._deliver(inner, spans, result)

            def shutdown(self) -> None:
                inner.shutdown()

            def force_flush(self, timeout_millis: int = 30_000) -> bool:
                return inner.force_flush(timeout_millis)

        attrs = {"service.name": service_name, **({"rl.run": run_id} if run_id else {})}
        self._provider = tracer_provider(resource=resource.create(attrs))
        self._provider.add_span_processor(batch(Counting(), export_timeout_millis=int(timeout_s * 1000)))
        self._tracer = self._provider.get_tracer("hrl.runners.telemetry")

    def _deliver(self, inner: Any, spans: Sequence[Any], result: Any) -> Any:
        if time.monotonic() < self._down_until:
            return self._failed(len(spans), result, "skipped while the collector is unreachable")
        try:
            outcome = inner.export(spans)
        except Exception as e:  # the exporter reports failures as a result; anything else counts the same way
            return self._failed(len(spans), result, str(e))
        if outcome != result.SUCCESS:
            self._down_until = time.monotonic() + RETRY_AFTER_S
            return self._failed(len(spans), result, "the export request failed")
        with self._lock:
            self.exported += len(spans)
        return outcome

    def _failed(self, n: int, result: Any, why: str) -> Any:
        with self._lock:
            self.dropped += n
            first, self._warned = not self._warned, True
        if first:
            self._warn(f"OTLP export to {self.url} failed ({why}); spans are dropped and counted, the run goes on")
        return result.FAILURE

    def emit(self, span: Span, parent: Any = None) -> None:
        """Start and end `span` (and its children) with their recorded times."""
        ctx = self._api.set_span_in_context(parent) if parent is not None else None
        s = self._tracer.start_span(
            span["name"], context=ctx, start_time=span["start_ns"], attributes=span["attributes"]
        )
        if span.get("error"):
            s.set_status(self._api.Status(self._api.StatusCode.ERROR, str(span["error"])[:200]))
        for child in span["children"]:
            self.emit(child, s)
        s.end(end_time=max(span["end_ns"], span["start_ns"]))

    def export_trace(self, trace: dict[str, Any], source: str | Path | None = None) -> None:
        phase, step = step_of(source)
        self.emit(episode_spans(trace, run_id=self.run_id, step=step, phase=self.phase or phase,
                                trainer_version=self.trainer_version, provider=self.provider))  # fmt: skip

    def export_step(self, metrics: dict[str, Any], step: int) -> None:
        version = metrics.get("train/version")
        if isinstance(version, int | float) and not isinstance(version, bool):
            self.trainer_version = int(version)
        now = time.time()
        self.emit(step_span(metrics, step, self._last_step_s, now, self.run_id))
        self._last_step_s = now

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued (bounded by `timeout_s`) and stop the export thread."""
        self._provider.force_flush(int(timeout_s * 1000))
        self._provider.shutdown()


# ---- the process's exporter --------------------------------------------------------------------------------

_active: OtlpExporter | None = None


def export_written(trace: dict[str, Any], source: str | Path | None = None) -> None:
    """Called by every trace writer after a trace is on disk: exports it when an exporter is active. Never raises:
    a telemetry fault must not lose an episode."""
    if _active is None:
        return
    try:
        _active.export_trace(trace, source)
    except Exception as e:
        _active._failed(1, _sdk()[6], f"could not build the spans: {e}")


def export_step(metrics: dict[str, Any], step: int) -> None:
    """Called with each step's metrics: a `rl.step` span when an exporter is active. Never raises."""
    if _active is None:
        return
    try:
        _active.export_step(metrics, step)
    except Exception as e:
        _active._failed(1, _sdk()[6], f"could not build the step span: {e}")


def resolve_endpoint(config: TelemetryConfig | None) -> str:
    """The recipe's (or --otlp's) endpoint, else $OTEL_EXPORTER_OTLP_ENDPOINT, else "" (no export)."""
    return (config.otlp_endpoint if config else "") or os.environ.get(ENV_ENDPOINT, "")


@contextmanager
def exporting(
    config: TelemetryConfig | None,
    *,
    run_id: str = "",
    provider: str = "hrl",
    phase: str | None = None,
    say: Callable[[str], object] = lambda _: None,
) -> Iterator[OtlpExporter | None]:
    """The process's exporter for the block (None without an endpoint: then the SDK is not even imported);
    flushed and shut down on exit, with one line saying what was sent and what was dropped."""
    global _active
    endpoint = resolve_endpoint(config)
    if not endpoint or _active is not None:  # none asked for, or an outer run already exports
        yield _active
        return
    cfg = config or TelemetryConfig()
    exporter = OtlpExporter(endpoint, run_id=run_id, provider=provider, service_name=cfg.service_name,
                            timeout_s=cfg.export_timeout_s, warn=say, phase=phase)  # fmt: skip
    _active = exporter
    try:
        yield exporter
    finally:
        _active = None
        exporter.close(timeout_s=2 * cfg.export_timeout_s)
        say(f"OTLP: {exporter.exported} spans sent to {exporter.url}, {exporter.dropped} dropped")
