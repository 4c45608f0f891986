"""A trace as OpenTelemetry span dicts: an episode span with one child per model call and per tool event, and a
training step as a span. Pure functions, no SDK: the live exporter (`otlp`) and the OTLP/JSON file export
(`otlp_json`) both send these, so a trace maps to spans in one place. Every attribute is listed in
docs/telemetry.md; `gen_ai.*` follow the OpenTelemetry GenAI semantic conventions, `rl.*` are hrl's.

A span dict: {name, start_ns, end_ns, attributes, error, children}. Times are the ones the trace recorded (epoch
nanoseconds). Token ids never go into a span: calls carry token counts.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

__all__ = ["Span", "episode_spans", "otlp_trace_id", "step_of", "step_span"]

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
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    attrs = {"rl.run": run_id or None, "rl.step": step, **numbers}
    return {"name": f"rl.step {step}", "start_ns": _ns(start_s), "end_ns": _ns(end_s), "attributes": _clean(attrs),
            "error": None, "children": []}  # fmt: skip


def otlp_trace_id(trace_id: str) -> str:
    """The OTLP trace id (32 hex digits) of an hrl trace: its own id when OTLP can carry it (a proxy's uuid4 hex,
    not all zero), so a span finds its trace file by id; else a hash of it. `otlp_json` gives the same ids."""
    ok = len(trace_id) == 32 and all(c in "0123456789abcdef" for c in trace_id) and trace_id.strip("0")
    return trace_id if ok else hashlib.sha256(trace_id.encode()).hexdigest()[:32]
