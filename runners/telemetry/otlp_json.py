"""Traces as OTLP/JSON (the JSON encoding of an `ExportTraceServiceRequest`), for `hrl export --format otlp-json`:
the same span dicts the live OTLP exporter sends (`spans.episode_spans`: an episode span, a child per model call
and per tool event, `gen_ai.*` and `rl.*` attributes, no token ids), written as a file any collector, Jaeger or
Tempo import reads, without the OpenTelemetry SDK.

Encoding per the OTLP/JSON spec: trace and span ids as lowercase hex, 64-bit integers (times, int attributes) as
decimal strings, enums as integers. The OTLP trace id is the hrl trace id (hashed when it is not 32 hex digits) and
span ids hash their place under it, so exporting the same trace twice gives the same ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from hrl.runners.telemetry.spans import Span, episode_spans, otlp_trace_id, step_of

__all__ = ["SPAN_KIND_CLIENT", "SPAN_KIND_INTERNAL", "any_value", "export_request"]

SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.StatusCode


def _hex(seed: str, chars: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:chars]


def any_value(v: Any) -> dict[str, Any]:
    """A Python attribute value as an OTLP `AnyValue` (bool before int: a bool is an int in Python)."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in attrs.items()]


def _spans(span: Span, trace_id: str, path: str, parent: str | None) -> list[dict[str, Any]]:
    """`span` and its children, flattened; each span id a hash of its place in the tree."""
    span_id = _hex(f"{trace_id}/{path}", 16)
    op = span["attributes"].get("gen_ai.operation.name")
    out: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": span["name"],
        "kind": SPAN_KIND_CLIENT if op == "chat" else SPAN_KIND_INTERNAL,
        "startTimeUnixNano": str(span["start_ns"]),
        "endTimeUnixNano": str(max(span["end_ns"], span["start_ns"])),
        "attributes": _attributes(span["attributes"]),
        "status": {"code": STATUS_ERROR, "message": str(span["error"])[:200]} if span.get("error") else {},
    }
    if parent is not None:
        out["parentSpanId"] = parent
    rows = [out]
    for n, child in enumerate(span["children"]):
        rows += _spans(child, trace_id, f"{path}/{n}", span_id)
    return rows


def export_request(
    traces: list[tuple[str | Path | None, dict[str, Any]]],
    *,
    run_id: str = "",
    provider: str = "hrl",
    service_name: str = "hrl",
    version: str = "",
    trainer_version: int | None = None,
) -> dict[str, Any]:
    """(source file, trace) pairs as one ExportTraceServiceRequest dict: one resource, one scope, every trace's
    episode span tree under its own OTLP trace id. The file name gives `rl.step` and `rl.phase` (`spans.step_of`);
    `trainer_version` (the version the step trained, when known) gives `rl.staleness`."""
    spans: list[dict[str, Any]] = []
    for source, trace in traces:
        phase, step = step_of(source)
        tree = episode_spans(
            trace, run_id=run_id, step=step, phase=phase, trainer_version=trainer_version, provider=provider
        )
        spans += _spans(tree, otlp_trace_id(str(trace["trace_id"])), "episode", None)
    resource = {"service.name": service_name, **({"rl.run": run_id} if run_id else {})}
    scope = {"name": "hrl.runners.telemetry", **({"version": version} if version else {})}
    return {"resourceSpans": [{"resource": {"attributes": _attributes(resource)},
                               "scopeSpans": [{"scope": scope, "spans": spans}]}]}  # fmt: skip
