"""Metrics from traces, per trace and per training step: pure functions over `hrl.trace/1` objects, no I/O.

The names below are a public contract (metrics.jsonl, TensorBoard, W&B, `hrl report`): add, never rename.

Per trace (`trace_metrics`), in seconds, tokens or counts; a value that does not exist for a trace (no reward,
no sampled tokens, a non-numeric env version, no trainer version) is left out rather than set to 0:

- `trace/latency_s`          trace `ended_at − started_at` (agent start to verifier end).
- `trace/llm_latency_s`      Σ over all calls (side calls too) of `ended_at − started_at`.
- `trace/tool_latency_s`     time the agent spent between model calls, see `tool_latency_s`.
- `trace/turns`              non-side calls (agent turns).
- `trace/failures/<reason>`  1 for the trace's `failure_reason` (absent when it did not fail).
- `trace/reward`             the verifier's reward.
- `trace/success`            1 when the task's own pass/fail rule passed, 0 when not (the trace's `success`, else
  `reward == 1.0` for older traces); absent when unknown. Per step its mean is the success rate, which a shaped
  reward does not move.
- `trace/policy_version_min` / `trace/policy_version_max`: oldest / newest policy version of a sampled token.
- `trace/env_version`        `env.version` when it is a number (or a numeric string).
- `trace/staleness`          trainer version at use − `trace/policy_version_min` (needs `trainer_version`).
- `trace/prompt_tokens`      Σ over calls of the full prompt length (what an API would bill as input).
- `trace/response_tokens`    Σ over calls of sampled tokens.
- `trace/branches`           root-to-leaf paths of the token tree (= training samples).
- `trace/merge_ratio`        tokens of the calls on their own ÷ tokens of the merged branches (≥ 1).
- `trace/tool_parse_errors`  calls whose tool-call markup did not parse (`tool_parse_error`; sent as text);
  absent when none did. Per step: the sum over the step's traces, 0 included.
- `trace/sandbox_acquire_s`  infrastructure time apart from the agent's: asking for the episode's sandbox to holding
  it at the task's start state (created or taken from the warm pool, then the task laid out; or a group's reused
  one, reset and checked); trace metadata `sandbox_acquire_s`. `trace/sandbox_reset_s`: the reset and its check,
  for a reused sandbox only. `trace/harness_start_s`: the harness's start-up, from launching the agent CLI to the
  first model call the trace records (trace metadata `harness_start_s`; absent for an episode with no call).
- `trace/degenerate`         1 for a trace flagged `degenerate` (one model call for an agentic task: the call
  offered tools and no second call followed); absent otherwise. Per step: how many, 0 included.

Per step (`step_metrics`) over the step's traces:

- a distribution metric `X` (every per-trace name above except failures) becomes `X` = mean over the traces
  that have it, and `X/min`, `X/p50`, `X/p95`, `X/max` (linear-interpolated percentiles). The bare name keeps
  its meaning as the step's headline number (e.g. `trace/reward` is the mean reward).
- `trace/failures/<reason>` = how many traces failed for that reason, every known reason present (0 included,
  so plots have continuous lines); `trace/failures/none` counts traces that did not fail; `trace/count` all.
- per call, the same distribution suffixes: `call/latency_s`, `call/first_token_s`, `call/prompt_tokens`,
  `call/response_tokens`.
- `rollout/reset_mismatch`: reused sandboxes whose reset did not hash as their group's starting state (closed, a
  fresh one made), summed over the step's traces; present when any trace says how its sandbox was had.
- `engine/busy_frac`: the fraction of the rollout window (first trace start → last trace end) in which at
  least one call was in flight, measured from the traces' absolute call times.
- `train/version` = the trainer version the step was computed against, when given.
- per harness (the trace's `agent.name`; several in a run with `rollout.agents`): `harness/<name>/reward` (mean
  over its traces with a reward; absent when none has one), `harness/<name>/turns` (mean), `harness/<name>/count`
  and `harness/<name>/failed` (traces with a failure_reason).

Named here but produced elsewhere: `train/mismatch_kl`, `train/loss`, `train/grad_norm`, `train/update_norm` (the
norm of the update the step applied to the master weights; 0 when it trained on nothing) (the trainer step),
`proxy/pause_s`, `proxy/queue_depth` (the proxy's stats), `proxy/cpu_us_per_token` (CPU microseconds of the
event loop the proxy serves on ÷ tokens it streamed in the step's window, `Proxy.take_cpu_per_token`; absent when
none was streamed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from hrl.runners.summary import describe_calls, percentile, summarize_trace
from hrl.runners.trace import FAILURE_REASONS

__all__ = [
    "CALL_METRICS",
    "CONTRACT",
    "DEGENERATE",
    "DISTRIBUTION_STATS",
    "FAILURES_PREFIX",
    "HARNESS_PREFIX",
    "STEP_ONLY_METRICS",
    "SYSTEM_METRICS",
    "TRACE_METRICS",
    "TRAIN_METRICS",
    "distribution",
    "engine_busy_frac",
    "failure_counts",
    "harness_metrics",
    "harness_rewards",
    "step_metrics",
    "tool_latency_s",
    "trace_metrics",
]

Trace = dict[str, Any]

LATENCY_S = "trace/latency_s"
LLM_LATENCY_S = "trace/llm_latency_s"
TOOL_LATENCY_S = "trace/tool_latency_s"
TURNS = "trace/turns"
REWARD = "trace/reward"
SUCCESS = "trace/success"
POLICY_VERSION_MIN = "trace/policy_version_min"
POLICY_VERSION_MAX = "trace/policy_version_max"
ENV_VERSION = "trace/env_version"
STALENESS = "trace/staleness"
PROMPT_TOKENS = "trace/prompt_tokens"
RESPONSE_TOKENS = "trace/response_tokens"
BRANCHES = "trace/branches"
MERGE_RATIO = "trace/merge_ratio"
TOOL_PARSE_ERRORS = "trace/tool_parse_errors"
DEGENERATE = "trace/degenerate"
FAILURES_PREFIX = "trace/failures/"
HARNESS_PREFIX = "harness/"

SANDBOX_ACQUIRE_S = "trace/sandbox_acquire_s"
SANDBOX_RESET_S = "trace/sandbox_reset_s"
HARNESS_START_S = "trace/harness_start_s"
RESET_MISMATCH = "rollout/reset_mismatch"

TRACE_METRICS = (
    LATENCY_S,
    LLM_LATENCY_S,
    TOOL_LATENCY_S,
    TURNS,
    REWARD,
    SUCCESS,
    POLICY_VERSION_MIN,
    POLICY_VERSION_MAX,
    ENV_VERSION,
    STALENESS,
    PROMPT_TOKENS,
    RESPONSE_TOKENS,
    BRANCHES,
    MERGE_RATIO,
)
"""Per-trace distribution metrics; each is also a step metric (mean) with `DISTRIBUTION_STATS` suffixes."""

SANDBOX_METRICS = (SANDBOX_ACQUIRE_S, SANDBOX_RESET_S, HARNESS_START_S)
"""Per-trace distributions too, but only of traces whose rollouts say how their sandbox was had (agent CLIs)."""

CALL_METRICS = ("call/latency_s", "call/first_token_s", "call/prompt_tokens", "call/response_tokens")
DISTRIBUTION_STATS = ("min", "p50", "p95", "max")
TRAIN_METRICS = ("train/mismatch_kl", "train/loss", "train/grad_norm", "train/update_norm")
SYSTEM_METRICS = ("proxy/pause_s", "proxy/queue_depth", "proxy/cpu_us_per_token", "engine/busy_frac")
STEP_ONLY_METRICS = ("trace/count", f"{FAILURES_PREFIX}none", "train/version", "engine/busy_frac")
CONTRACT = (
    *TRACE_METRICS,
    *SANDBOX_METRICS,
    RESET_MISMATCH,
    *(FAILURES_PREFIX + r for r in FAILURE_REASONS),
    TOOL_PARSE_ERRORS,
    DEGENERATE,
    *TRAIN_METRICS,
    *SYSTEM_METRICS,
)
"""Every name the issue fixed (plus one per known failure reason); tests assert it only ever grows."""


# ---- per trace ---------------------------------------------------------------------------------------------


def tool_latency_s(trace: Trace) -> float:
    """Seconds the agent spent between its model calls: running tools, mostly (tool events are timed the same
    way: from the response that asked for a tool to the next request).

    Precisely: take the non-side calls' `[started_at, ended_at]` intervals and their union; the result is the
    total length of the gaps inside that union. For a sequential agent that is Σ (start of call k+1 − end of
    call k). Overlapping calls (a concurrent sub-agent) count once, so a gap is time with no agent call in
    flight; side calls (title generation) are left out because they run while tools do. Time before the first
    call (agent start-up) and after the last (final tools, the verifier) is not counted.
    """
    spans = sorted(
        (float(c["started_at"]), float(c["ended_at"]))
        for c in trace["calls"]
        if not c.get("side", False) and c.get("started_at") is not None and c.get("ended_at") is not None
    )
    gaps, reach = 0.0, None
    for start, end in spans:
        if reach is not None and start > reach:
            gaps += start - reach
        reach = end if reach is None else max(reach, end)
    return round(gaps, 3)


def _number(value: Any) -> float | None:
    """A float for an int, float or numeric string; None for anything else (bool included)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def trace_metrics(trace: Trace, trainer_version: int | None = None) -> dict[str, float]:
    """One trace's contract metrics (see the module docstring); `trainer_version` adds staleness."""
    s = summarize_trace(trace)
    out = {
        LATENCY_S: float(s["duration_s"]),
        LLM_LATENCY_S: float(s["llm_s"]),
        TOOL_LATENCY_S: tool_latency_s(trace),
        TURNS: float(s["turns"]),
        PROMPT_TOKENS: float(s["prompt_tokens"]),
        RESPONSE_TOKENS: float(s["response_tokens"]),
        BRANCHES: float(s["branches"]),
    }
    optional = {
        REWARD: _number(s["reward"]),
        SUCCESS: None if s["success"] is None else float(s["success"]),
        MERGE_RATIO: _number(s["merge_ratio"]),
        POLICY_VERSION_MIN: _number(min(s["versions"], default=None)),
        POLICY_VERSION_MAX: _number(max(s["versions"], default=None)),
        ENV_VERSION: _number((trace.get("env") or {}).get("version")),
        SANDBOX_ACQUIRE_S: _number((trace.get("metadata") or {}).get("sandbox_acquire_s")),
        SANDBOX_RESET_S: _number((trace.get("metadata") or {}).get("sandbox_reset_s")),
        HARNESS_START_S: _number((trace.get("metadata") or {}).get("harness_start_s")),
    }
    if trainer_version is not None and s["versions"]:
        optional[STALENESS] = float(trainer_version - min(s["versions"]))
    out |= {k: v for k, v in optional.items() if v is not None}
    parse_errors = sum(1 for c in trace.get("calls") or [] if c.get("tool_parse_error"))
    if parse_errors:
        out[TOOL_PARSE_ERRORS] = float(parse_errors)
    if trace.get("degenerate"):
        out[DEGENERATE] = 1.0
    if s["failure_reason"]:
        out[FAILURES_PREFIX + str(s["failure_reason"])] = 1.0
    return out


# ---- per step ----------------------------------------------------------------------------------------------


def distribution(name: str, values: list[float]) -> dict[str, float]:
    """`name` = mean, plus `name/min`, `/p50`, `/p95`, `/max`; empty for no values."""
    if not values:
        return {}
    xs = sorted(values)
    return {
        name: sum(xs) / len(xs),
        f"{name}/min": xs[0],
        f"{name}/p50": float(percentile(xs, 0.5) or 0.0),
        f"{name}/p95": float(percentile(xs, 0.95) or 0.0),
        f"{name}/max": xs[-1],
    }


def failure_counts(traces: Iterable[Trace]) -> dict[str, float]:
    """`trace/failures/<reason>` for every known reason (0 included) and any other present; `/none` for the
    traces that did not fail."""
    seen = Counter(t.get("failure_reason") or "none" for t in traces)
    reasons = dict.fromkeys((*FAILURE_REASONS, "none"), 0) | seen
    return {FAILURES_PREFIX + str(r): float(n) for r, n in reasons.items()}


def engine_busy_frac(traces: Iterable[Trace]) -> float | None:
    """Fraction of the window from the first trace's start to the last one's end with ≥ 1 call in flight
    (absolute times: the trace's `started_at` + the call's relative times); None without a window."""
    traces = list(traces)
    if not traces:
        return None
    lo = min(float(t["started_at"]) for t in traces)
    hi = max(float(t["ended_at"]) for t in traces)
    spans = sorted(
        (float(t["started_at"]) + float(c["started_at"]), float(t["started_at"]) + float(c["ended_at"]))
        for t in traces
        for c in t["calls"]
        if c.get("started_at") is not None and c.get("ended_at") is not None
    )
    busy, reach = 0.0, lo
    for start, end in spans:
        start, end = max(start, reach), min(end, hi)
        if end > start:
            busy += end - start
            reach = end
    return round(busy / (hi - lo), 4) if hi > lo else None


def step_metrics(traces: Iterable[Trace], trainer_version: int | None = None) -> dict[str, float]:
    """The step's metrics over its traces (see the module docstring for names and suffixes)."""
    traces = list(traces)
    per = [trace_metrics(t, trainer_version) for t in traces]
    out: dict[str, float] = {"trace/count": float(len(traces))}
    if trainer_version is not None:
        out["train/version"] = float(trainer_version)
    out |= failure_counts(traces)
    out[TOOL_PARSE_ERRORS] = sum(m.get(TOOL_PARSE_ERRORS, 0.0) for m in per)
    out[DEGENERATE] = sum(m.get(DEGENERATE, 0.0) for m in per)
    if any(SANDBOX_ACQUIRE_S in m for m in per):
        out[RESET_MISMATCH] = float(sum((t.get("metadata") or {}).get("sandbox_reset_mismatch", 0) for t in traces))
    for name in (*TRACE_METRICS, *SANDBOX_METRICS):
        out |= distribution(name, [m[name] for m in per if name in m])
    rows = [c for t in traces for c in describe_calls(t)]
    for name, key in zip(CALL_METRICS, ("total_s", "first_token_s", "prompt_tokens", "response_tokens"), strict=True):
        out |= distribution(name, [float(c[key]) for c in rows])
    busy = engine_busy_frac(traces)
    if busy is not None:
        out["engine/busy_frac"] = busy
    return out | harness_metrics(traces, per)


def harness_rewards(metrics: dict[str, Any]) -> dict[str, float]:
    """{harness: mean reward} read back from a step's `harness/<name>/reward` metrics, by name."""
    suffix = "/reward"
    return {k[len(HARNESS_PREFIX) : -len(suffix)]: float(v) for k, v in sorted(metrics.items())
            if k.startswith(HARNESS_PREFIX) and k.endswith(suffix) and isinstance(v, int | float)}  # fmt: skip


def harness_metrics(traces: list[Trace], per: list[dict[str, float]]) -> dict[str, float]:
    """The step split by harness (see the module docstring): `per` are the traces' own `trace_metrics`."""
    by: dict[str, list[dict[str, float]]] = {}
    for trace, m in zip(traces, per, strict=True):
        by.setdefault(str((trace.get("agent") or {}).get("name") or "unknown"), []).append(m)
    out: dict[str, float] = {}
    for name, ms in sorted(by.items()):
        key = f"{HARNESS_PREFIX}{name}/"
        rewards = [m[REWARD] for m in ms if REWARD in m]
        out[key + "count"] = float(len(ms))
        out[key + "failed"] = float(sum(any(k.startswith(FAILURES_PREFIX) for k in m) for m in ms))
        out[key + "turns"] = sum(m[TURNS] for m in ms) / len(ms)
        if rewards:
            out[key + "reward"] = sum(rewards) / len(rewards)
    return out
