"""OpenTelemetry out: each written trace as an episode span with one child span per model call and per tool
event, and each training step as a span, sent over OTLP/HTTP through the official SDK (docs/telemetry.md).

    with exporting(run.telemetry, run_id="hrl-1a2b", provider="vllm") as exporter:
        writer = TraceWriter(path, export=exporter.export_written if exporter else None)
        ...  # each writer.write now exports the trace it wrote; each step's metrics (export_step) too

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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hrl.config import TelemetryConfig
from hrl.runners.errors import PrerequisiteError
from hrl.runners.telemetry.spans import Span, episode_spans, otlp_trace_id, step_of, step_span

__all__ = ["OtlpExporter", "TelemetryConfig", "export_step", "exporting"]

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
PIP_HINT = "pip install 'hrl[telemetry]' (opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
RETRY_AFTER_S = 30.0  # after a failed export, batches are dropped (counted) this long instead of waiting on a dead host


# ---- the SDK -----------------------------------------------------------------------------------------------


def _sdk() -> Any:
    """The SDK modules, imported on first use; PrerequisiteError with the pip line when they are missing."""
    try:
        from opentelemetry import trace as api
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    except ImportError as e:
        raise PrerequisiteError(f"OTLP export needs the OpenTelemetry SDK ({e})", hint=PIP_HINT) from None
    return SimpleNamespace(api=api, OTLPSpanExporter=OTLPSpanExporter, Resource=Resource, SpanLimits=SpanLimits,
                           TracerProvider=TracerProvider, BatchSpanProcessor=BatchSpanProcessor,
                           SpanExporter=SpanExporter, SpanExportResult=SpanExportResult,
                           RandomIdGenerator=RandomIdGenerator)  # fmt: skip


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
        sdk = _sdk()
        api, base, result = sdk.api, sdk.SpanExporter, sdk.SpanExportResult
        logging.getLogger("opentelemetry").addHandler(logging.NullHandler())  # our one warning, not the SDK's
        self.url, self.run_id, self.provider, self._api = traces_url(endpoint), run_id, provider, api
        self.phase = phase  # None: read from each trace file's name (step_of)
        self.exported = self.dropped = 0
        self.trainer_version: int | None = None
        self._warn, self._warned, self._down_until = warn, False, 0.0
        self._lock = threading.Lock()
        self._last_step_s = time.time()
        inner = sdk.OTLPSpanExporter(endpoint=self.url, timeout=timeout_s)
        outer = self

        class Counting(base):  # a SpanExporter: delivery counted, a dead collector skipped for RETRY_AFTER_S
            def export(self, spans: Sequence[Any]) -> Any:
                return outer._deliver(inner, spans, result)

            def shutdown(self) -> None:
                inner.shutdown()

            def force_flush(self, timeout_millis: int = 30_000) -> bool:
                return inner.force_flush(timeout_millis)

        class Ids(sdk.RandomIdGenerator):  # an episode's OTLP trace id is its hrl trace id (`otlp_trace_id`)
            next_trace_id: int | None = None

            def generate_trace_id(self) -> int:
                given, self.next_trace_id = self.next_trace_id, None
                return given if given is not None else super().generate_trace_id()

        self._ids, self._ids_lock = Ids(), threading.Lock()
        attrs = {"service.name": service_name, **({"rl.run": run_id} if run_id else {})}
        limits = sdk.SpanLimits(max_span_attributes=sdk.SpanLimits.UNSET)  # a step span has one per metric (100s)
        self._provider = sdk.TracerProvider(resource=sdk.Resource.create(attrs), id_generator=self._ids,
                                            span_limits=limits)  # fmt: skip
        self._provider.add_span_processor(
            sdk.BatchSpanProcessor(Counting(), export_timeout_millis=int(timeout_s * 1000))
        )
        self._tracer = self._provider.get_tracer("hrl.runners.telemetry")

    def _deliver(self, inner: Any, spans: Sequence[Any], result: Any) -> Any:
        if time.monotonic() < self._down_until:
            return self._failed(len(spans), result, "skipped while the collector is unreachable")
        try:
            outcome = inner.export(spans)
        except Exception as e:  # the exporter reports failures as a result; anything else counts the same way
            outcome, why = None, str(e)
        else:
            why = "the export request failed"
        if outcome != result.SUCCESS:
            self._down_until = time.monotonic() + RETRY_AFTER_S
            return self._failed(len(spans), result, why)
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

    def emit(self, span: Span, parent: Any = None, trace_id: str | None = None) -> None:
        """Start and end `span` (and its children) with their recorded times; a root span under `trace_id`."""
        ctx = self._api.set_span_in_context(parent) if parent is not None else None
        chat = span["attributes"].get("gen_ai.operation.name") == "chat"  # GenAI conventions: a client span
        kind = self._api.SpanKind.CLIENT if chat else self._api.SpanKind.INTERNAL
        with self._ids_lock:  # the id generator hands `trace_id` to this span only
            self._ids.next_trace_id = int(trace_id, 16) if trace_id and parent is None else None
            s = self._tracer.start_span(span["name"], context=ctx, kind=kind, start_time=span["start_ns"],
                                        attributes=span["attributes"])  # fmt: skip
            self._ids.next_trace_id = None
        if span.get("error"):
            s.set_status(self._api.Status(self._api.StatusCode.ERROR, str(span["error"])[:200]))
        for child in span["children"]:
            self.emit(child, s)
        s.end(end_time=max(span["end_ns"], span["start_ns"]))

    def export_trace(self, trace: dict[str, Any], source: str | Path | None = None) -> None:
        phase, step = step_of(source)
        tree = episode_spans(trace, run_id=self.run_id, step=step, phase=self.phase or phase,
                             trainer_version=self.trainer_version, provider=self.provider)  # fmt: skip
        self.emit(tree, trace_id=otlp_trace_id(str(trace["trace_id"])))

    def export_written(self, trace: dict[str, Any], source: str | Path | None = None) -> None:
        """A trace writer's `export` (`TraceWriter(path, export=exporter.export_written)`): the trace's spans, once
        it is on disk. Never raises: a telemetry fault must not lose an episode."""
        self._guarded(lambda: self.export_trace(trace, source), "the spans")

    def _guarded(self, export: Callable[[], None], what: str) -> None:
        try:
            export()
        except Exception as e:
            self._failed(1, _sdk().SpanExportResult, f"could not build {what}: {e}")

    def export_step(self, metrics: dict[str, Any], step: int) -> None:
        version = metrics.get("version", metrics.get("train/version"))  # the trainer's version after the step
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


def export_step(metrics: dict[str, Any], step: int) -> None:
    """Called with each step's metrics: a `rl.step` span when an exporter is active. Never raises."""
    exporter = _active
    if exporter is not None:
        exporter._guarded(lambda: exporter.export_step(metrics, step), "the step span")


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
