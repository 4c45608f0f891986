"""Numbers about `hrl.trace/1` traces, for `hrl inspect` and the metrics: pure functions, no printing.

Calls form a token tree: a call is a child of the call it names as `parent` (its prompt extends that call's
prompt + response exactly); calls without one are roots. Each root-to-leaf path is a branch, i.e. one training
sample, whose tokens are the leaf's prompt + response. Token counts come from the stored lengths, so nothing
here materializes prompt ids.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from hrl.runners.errors import UsageError
from hrl.runners.trace import branches, dropped_media, full_len, prompt_len, sampled_versions, trace_success

__all__ = [
    "TraceSelectionError",
    "chosen_traces",
    "describe_branches",
    "describe_calls",
    "describe_traces",
    "failure_cause",
    "infra_failure",
    "media_text",
    "percentile",
    "select_trace",
    "summarize_file",
    "summarize_trace",
    "timeline",
]

Trace = dict[str, Any]


class TraceSelectionError(UsageError):
    """`--trace ID` matched no trace, or (as a prefix) several; the message lists candidates."""


# ---- per call ----------------------------------------------------------------------------------------------


def _span(obj: dict[str, Any], start: str = "started_at", end: str = "ended_at") -> float:
    a, b = obj.get(start), obj.get(end)
    return max(0.0, float(b) - float(a)) if a is not None and b is not None else 0.0


def describe_calls(trace: Trace) -> list[dict[str, Any]]:
    """One row per call: ids, tree parent, token counts, finish reason, versions, timing (seconds)."""
    rows, seen = [], set()
    for c in trace["calls"]:
        rows.append(
            {
                "call_id": c["call_id"],
                "dialect": c["dialect"],
                "stream": bool(c["stream"]),
                "side": bool(c.get("side", False)),
                "parent": c.get("parent") if c.get("parent") in seen else None,  # a parent is an earlier call
                "prompt_tokens": prompt_len(c),
                "response_tokens": len(c["response_ids"]),
                "finish_reason": c["finish_reason"],
                "versions": sorted(set(sampled_versions(c))),
                "started_at": c.get("started_at"),
                "first_token_s": round(_span(c, "started_at", "first_token_at"), 3),
                "total_s": round(_span(c), 3),
                "error": c.get("error"),
                "tool_parse_error": c.get("tool_parse_error"),
                "dropped_media": c.get("dropped_media") or {},  # media left out of its request, by kind
                "media": c.get("media") or [],  # the images of its prompt (sha256, size, placeholder range)
                "agent": c.get("agent"),  # None: the root agent
                "trainable": c.get("trainable", True),
            }
        )
        seen.add(c["call_id"])
    return rows


def timeline(trace: Trace) -> list[tuple[str, int, bool]]:
    """The trace's calls and tool events in time order, a tool after the call that asked for it: ("call", its index,
    whether it is its agent's first call) and ("tool", its index, False)."""
    calls = trace["calls"]
    firsts = {c.get("agent"): i for i, c in reversed(list(enumerate(calls)))}
    events = [((c.get("started_at") or 0.0, 0), ("call", i, firsts[c.get("agent")] == i)) for i, c in enumerate(calls)]
    events += [((t.get("started_at") or 0.0, 1), ("tool", i, False)) for i, t in enumerate(trace.get("tools") or [])]
    return [event for _, event in sorted(events, key=lambda e: e[0])]


# ---- the token tree ----------------------------------------------------------------------------------------


def describe_branches(trace: Trace) -> list[dict[str, Any]]:
    """Each branch (training sample): its call ids root to leaf, total tokens, tokens the engine sampled in it
    (the loss tokens), first and last policy version of those, and whether a side call is on it."""
    calls = trace["calls"]
    out = []
    for path in branches(trace):
        versions = [v for i in path for v in sampled_versions(calls[i])]
        out.append(
            {
                "calls": [calls[i]["call_id"] for i in path],
                "tokens": full_len(calls[path[-1]]),
                "loss_tokens": sum(len(calls[i]["response_ids"]) for i in path),
                "first_version": versions[0] if versions else None,
                "last_version": versions[-1] if versions else None,
                "side": any(calls[i].get("side", False) for i in path),
            }
        )
    return out


# ---- per trace ---------------------------------------------------------------------------------------------


def _merge_ratio(calls: list[dict[str, Any]], paths: list[list[int]]) -> float | None:
    """Tokens of every call on its own ÷ tokens of the merged branches (≥ 1); None without tokens."""
    merged = sum(full_len(calls[p[-1]]) for p in paths)
    return round(sum(full_len(c) for c in calls) / merged, 3) if merged else None


def describe_traces(traces: list[Trace], conv: dict[str, Any] | None, *, samples: bool) -> Any:
    """`hrl inspect --json`: per-trace summaries (+ `samples` = branches); a single trace's (`conv`: its
    conversation) also with its calls, tool events and conversation, as one object."""
    out = []
    for t in traces:
        s = summarize_trace(t)
        if samples:
            s["samples"] = describe_branches(t)
        if conv is not None:
            s |= {"reward_info": t.get("reward_info") or {}, "call_details": describe_calls(t)}
            s |= {"tool_events": t.get("tools") or [], "conversation": conv}
        out.append(s)
    return out[0] if conv is not None else out


def summarize_trace(trace: Trace) -> dict[str, Any]:
    """One trace in numbers: outcome, call/turn/branch counts, token totals, merge ratio, latencies, versions."""
    calls = trace["calls"]
    main = [c for c in calls if not c.get("side", False)]
    paths = branches(trace)
    tools = trace.get("tools") or []
    return {
        "trace_id": trace["trace_id"],
        "task_id": trace.get("task_id"),
        "agent": (trace.get("agent") or {}).get("name"),
        "status": trace["status"],
        "failure_reason": trace.get("failure_reason"),
        "reward": trace.get("reward"),
        "success": trace_success(trace),  # the task's own pass/fail; older traces: reward == 1.0
        "calls": len(calls),
        "side_calls": len(calls) - len(main),
        "turns": len(main),
        "call_errors": sum(1 for c in calls if c.get("error")),
        "tool_parse_errors": sum(1 for c in calls if c.get("tool_parse_error")),
        "degenerate": bool(trace.get("degenerate")),
        "dropped_media": dropped_media(trace),
        "branches": len(paths),
        "prompt_tokens": sum(prompt_len(c) for c in calls),
        "response_tokens": sum(len(c["response_ids"]) for c in calls),
        "trained_tokens": sum(len(c["response_ids"]) for c in main),
        "merge_ratio": _merge_ratio(calls, paths),
        "duration_s": round(_span(trace), 3),
        "llm_s": round(sum((_span(c) for c in calls), 0.0), 3),
        "tool_s": round(sum((_span(t) for t in tools), 0.0), 3),
        "versions": sorted({v for c in calls for v in sampled_versions(c)}),
        "dialects": sorted({c["dialect"] for c in calls}),
        "tools": dict(sorted(Counter(t.get("name", "?") for t in tools).items())),
    }


def infra_failure(traces: list[Trace], max_error_rate: float) -> str | None:
    """What went wrong when more than `max_error_rate` of a finished run's episodes failed in the infrastructure (a
    cancelled episode is no such failure): how many, by reason, and the first one's cause; None when no more did."""
    from hrl.runners.trace import INFRA_FAILURES

    infra = Counter(str(t["failure_reason"]) for t in traces if t.get("failure_reason") in INFRA_FAILURES)
    infra.pop("cancelled", None)
    if sum(infra.values()) <= len(traces) * max_error_rate:
        return None
    which = ", ".join(f"{k} {v}" for k, v in sorted(infra.items()))
    first = next(t for t in traces if t.get("failure_reason") in infra)
    return (f"{sum(infra.values())} of {len(traces)} episodes failed in the infrastructure ({which}), more than "
            f"max_error_rate {max_error_rate:g} allows; the first: {failure_cause(first)}")  # fmt: skip


def failure_cause(trace: Trace, lines: int = 5) -> str:
    """Why an episode failed, in a few lines for an error message: its failure reason (and the agent's own, for an
    agent that ended before its first call), then the last lines the agent or the harness said (its stderr tail, or
    the error the harness recorded)."""
    meta = trace.get("metadata") or {}
    reason = str(trace.get("failure_reason"))
    if meta.get("agent_failure"):
        code = meta.get("agent_exit_code")
        reason += f" ({meta['agent_failure']}{'' if code is None else f', exit {code}'})"
    said = str(meta.get("agent_stderr_tail") or meta.get("error") or meta.get("agent_stdout_tail") or "").strip()
    tail = [ln for ln in said.splitlines() if ln.strip()][-lines:]
    return reason + (":\n  " + "\n  ".join(tail) if tail else " (the agent said nothing)")


def media_text(counts: dict[str, int]) -> str:
    """Dropped media for people: `1 image, 2 documents`."""
    return ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in sorted(counts.items()))


def chosen_traces(traces: list[Trace], trace_id: str | None, sources: Iterable[Any]) -> list[Trace]:
    """The traces `hrl inspect` shows: the one `trace_id` selects (`select_trace`), else all. None at all (read from
    `sources`) is an error (exit 1), not an empty screen: a run whose file stayed empty is a failed run."""
    if not traces:
        from hrl.runners.trace import TraceFormatError

        raise TraceFormatError(f"no traces in {' '.join(map(str, sources))}")
    return [select_trace(traces, trace_id)] if trace_id is not None else traces


def select_trace(traces: list[Trace], trace_id: str) -> Trace:
    """The trace whose id (or session token) is `trace_id`, or the only one whose id it is a prefix of."""
    exact = [t for t in traces if t["trace_id"] == trace_id] or [t for t in traces if t.get("session") == trace_id]
    matches = exact or [t for t in traces if str(t["trace_id"]).startswith(trace_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        ids = ", ".join(str(t["trace_id"]) for t in matches[:8]) + (", …" if len(matches) > 8 else "")
        raise TraceSelectionError(
            f"trace id prefix {trace_id!r} matches {len(matches)} traces: {ids}", hint="give a longer prefix"
        )
    known = ", ".join(str(t["trace_id"]) for t in traces[:5]) + (", …" if len(traces) > 5 else "")
    hint = f"known ids: {known} (run without --trace to list all)" if traces else "the file holds no traces"
    raise TraceSelectionError(f"no trace with id {trace_id!r} (nor with that session token)", hint=hint)


# ---- per file ----------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 1]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 3)


def _p50_p95(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95)}


def summarize_file(traces: Iterable[Trace]) -> dict[str, Any]:
    """Aggregate over traces: counts by status and failure reason, mean reward, token totals, p50/p95 latencies
    (trace duration, LLM time and tool time per trace; total time per call)."""
    traces = list(traces)
    sums = [summarize_trace(t) for t in traces]
    rewards = [s["reward"] for s in sums if s["reward"] is not None]
    graded = [s["success"] for s in sums if s["success"] is not None]
    return {
        "traces": len(sums),
        "status": dict(Counter(s["status"] for s in sums)),
        "failures": dict(Counter(s["failure_reason"] for s in sums if s["failure_reason"])),
        "degenerate": sum(s["degenerate"] for s in sums),
        "tool_parse_errors": sum(s["tool_parse_errors"] for s in sums),
        "dropped_media": sum(bool(s["dropped_media"]) for s in sums),  # traces with media dropped
        "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "rewarded": len(rewards),
        "succeeded": sum(graded),  # of `graded`: traces whose success is known
        "graded": len(graded),
        "calls": sum(s["calls"] for s in sums),
        "branches": sum(s["branches"] for s in sums),
        "tokens": {k: sum(s[f"{k}_tokens"] for s in sums) for k in ("prompt", "response", "trained")},
        "latency_s": {
            "duration": _p50_p95([s["duration_s"] for s in sums]),
            "llm": _p50_p95([s["llm_s"] for s in sums]),
            "tool": _p50_p95([s["tool_s"] for s in sums]),
            "call": _p50_p95([_span(c) for t in traces for c in t["calls"]]),
        },
    }
