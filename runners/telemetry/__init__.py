"""Telemetry out: traces as OpenTelemetry spans (`otlp`: OTLP/HTTP through the official SDK)."""

__all__: list[str] = []
