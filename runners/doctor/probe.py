"""`hrl doctor --model M`: what the served model does through the real proxy, before any sandbox starts.

- **tool calls**: a tool-eliciting chat request (a coding agent's system prompt, a bash tool, a task that needs
  it) is sent `tries` times over HTTP through the proxy; how many replies its tool parser read a call from, and
  why the others did not parse. A model that never calls a tool makes degenerate traces (one call each).
- **logprobs**: the ids each of those calls sampled (at temperature 0.7, so logprobs taken after temperature would
  show) are scored again by the engine itself in one teacher-forced pass at temperature 1 (`Engine.score`), and
  compared with the logprobs recorded while sampling: the trainer needs the raw model logprobs. For vLLM the
  server's `--logprobs-mode` is said too.

Nothing here raises for what it finds: each finding is a `Check`; an engine that cannot start raises as usual, and
a check that runs past its time limit (or waits on a call that times out) raises `CheckTimeoutError`, which names
it and carries the checks done before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp

from hrl.runners.doctor.checks import Check
from hrl.runners.engines.base import Engine
from hrl.runners.errors import HrlError
from hrl.runners.serving.stack import serving
from hrl.runners.trace import call_prompt_ids

__all__ = [
    "PROBE_REQUEST",
    "CheckTimeoutError",
    "logprobs_check",
    "probe_model",
    "run_served_checks",
    "served_checks",
    "tool_calls_check",
]

T = TypeVar("T")
_NEEDED = {  # what each served check's `required_for` says
    "probe": "agentic training",
    "publish lora": "training with hot weight swaps",
    "publish full": "training with hot weight swaps",
    "serve": "every served check",
}

PROBE_REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are a coding agent working in a repository. You act only by calling "
                                      "tools: answer every request with a tool call."},
        {"role": "user", "content": "List the files in the current directory."},
    ],
    "tools": [{"type": "function", "function": {
        "name": "bash", "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}],
    "temperature": 0.7,
}  # fmt: skip
RAW_MEAN_TOLERANCE = 0.02  # mean |Δ logprob| of a raw engine: float32 ~1e-6, bf16 on a GPU ~1e-2


class CheckTimeoutError(HrlError):
    """A served check timed out: past its own limit (`expired`), or on a call inside it. `checks` are the checks done
    before it and, last, the failed one (timed_out_after_s and limit_s in its figures). Its hint: what to try."""

    def __init__(self, name: str, seconds: float, limit_s: float, expired: bool, done: list[Check]) -> None:
        why = f"its limit of {limit_s:g} s" if expired else "a call inside it timed out"
        after = f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.2g}"
        figures = {"timed_out_after_s": round(seconds, 3), "limit_s": limit_s, "expired": expired}
        failed = Check(name, False, f"timed out after {after} s ({why})", _NEEDED.get(name, ""), figures=figures)
        if expired:
            hint = f"a loaded machine is slower: re-run with --timeout {2 * limit_s:g}, or when the machine is idle"
        else:
            hint = "a loaded machine is slower: re-run when it is idle; HRL_DEBUG=1 shows the call that timed out"
        super().__init__(f"the {name} check timed out after {after} s ({why})", hint=hint)
        self.name, self.seconds, self.limit_s, self.expired = name, seconds, limit_s, expired
        self.checks = [*done, failed]


async def _timed(name: str, work: Awaitable[T], limit_s: float, done: list[Check]) -> T:
    """`work` within `limit_s` seconds (0: no limit of its own); any TimeoutError is a CheckTimeoutError naming
    `name`, after how long, and the checks `done` before it."""
    t0 = time.monotonic()
    limit = asyncio.timeout(limit_s or None)
    try:
        async with limit:
            return await work
    except TimeoutError as e:
        raise CheckTimeoutError(name, time.monotonic() - t0, limit_s, limit.expired(), done) from e


async def served_checks(
    model: str,
    engine: str = "embedded",
    *,
    probe: bool = True,
    publish: tuple[str, ...] = (),
    engine_options: dict[str, Any] | None = None,
    proxy_options: dict[str, Any] | None = None,
    limit_s: float = 0,
) -> list[Check]:
    """Serve `model` once on `engine`; probe it (see the module docstring) and run the publish check of each kind
    in `publish` ("lora", "full": runners/doctor/publish.py) on the same engine. Each check (the probe, each
    publish) gets `limit_s` seconds (0: no limit); one that times out raises CheckTimeoutError, the rest not run."""
    from hrl.runners.doctor.publish import publish_check
    from hrl.runners.engines.vllm_server import checkpoint_dtype
    from hrl.runners.models import resolve_model

    checks: list[Check] = []
    t0 = time.monotonic()
    try:
        async with serving(model, engine, engine_options=engine_options, proxy_options=proxy_options) as stack:
            if probe:
                checks += await _timed("probe", _probe(stack, model, proxy_options), limit_s, checks)
            path = resolve_model(model)
            dtype = stack.engine.dtype
            dtype = checkpoint_dtype(path) if dtype == "auto" else dtype
            for kind in publish:
                check = publish_check(stack.engine, path, kind, dtype)
                checks.append(await _timed(f"publish {kind}", check, limit_s, checks))
    except TimeoutError as e:  # serving the model (its start or its stop), outside any check's own limit
        raise CheckTimeoutError("serve", time.monotonic() - t0, 0, False, checks) from e
    return checks


def run_served_checks(
    model: str, engine: str, options: dict[str, Any], probe: bool, publish: tuple[str, ...], limit_s: float
) -> list[Check]:
    """`hrl doctor --model`: `served_checks` on `engine` (default: vLLM where a GPU has it, else embedded), which is
    checked first with the model (a bad name is a usage error); each check within `limit_s` seconds."""
    from hrl.runners.preflight import check_engine, check_model
    from hrl.runners.serving.standalone import default_engine

    engine = engine or default_engine()
    check_engine(engine)
    check_model(model)
    return asyncio.run(
        served_checks(model, engine, probe=probe, publish=publish, proxy_options=options, limit_s=limit_s)
    )


async def probe_model(
    model: str,
    engine: str = "embedded",
    *,
    engine_options: dict[str, Any] | None = None,
    proxy_options: dict[str, Any] | None = None,
    tries: int = 3,
    max_tokens: int = 128,
) -> list[Check]:
    """Serve `model` on `engine` and probe it (see the module docstring): the parsers in use, tool calls, logprobs."""
    async with serving(model, engine, engine_options=engine_options, proxy_options=proxy_options) as stack:
        return await _probe(stack, model, proxy_options, tries, max_tokens)


async def _probe(
    stack: Any, model: str, proxy_options: dict[str, Any] | None, tries: int = 3, max_tokens: int = 128
) -> list[Check]:
    tmpl, session = stack.proxy.template, stack.proxy.open_session()
    body = {**PROBE_REQUEST, "model": "m", "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as http:
        for i in range(tries):  # a seed each: identical requests would count as one retried call
            async with http.post(f"{stack.url}/s/{session.token}/v1/chat/completions", json=body | {"seed": i}) as resp:
                await resp.read()
    trace = stack.proxy.end_session(session.token)
    how = "as configured"
    if (proxy_options or {}).get("reasoning_parser", "auto") == "auto":
        source = str(tmpl.tokenizer.chat_template or "")
        named = tmpl.reasoning_parser.name != "think" or "<think>" in source
        how = "detected from its chat template" if named else "the default: its chat template names no reasoning"
    reasoning = Check("reasoning", True, f"{tmpl.reasoning_parser.name} ({how})", f"reasoning of {model}")
    return [reasoning, tool_calls_check(trace, tmpl.tool_parser.name), await logprobs_check(stack.engine, trace)]


def tool_calls_check(trace: dict[str, Any], parser: str) -> Check:
    """How many of the trace's replies the tool parser read a call from (a failed call blocks: the engine broke)."""
    calls = trace["calls"]
    parsed = sum(c["finish_reason"] == "tool_calls" for c in calls)
    errors = [str(c["tool_parse_error"]) for c in calls if c.get("tool_parse_error")]
    failed = [str(c["error"]) for c in calls if c.get("error")]
    if failed:
        detail = f"{len(failed)} of {len(calls)} calls failed: {failed[0][:160]}"
    elif parsed:
        detail = f"{parsed} of {len(calls)} replies called a tool, read with {parser}"
    else:
        detail = f"none of {len(calls)} replies called a tool (its agent traces would be degenerate)"
    if errors:
        detail += f"; {len(errors)} held tool-call markup {parser} could not read: {errors[0][:160]}"
    return Check("tool calls", parsed > 0 and not failed, detail, "agentic training", blocking=bool(failed))


async def logprobs_check(engine: Engine, trace: dict[str, Any]) -> Check:
    """Whether the logprobs recorded in `trace` are the raw model logprobs of its sampled ids (`engine.score`)."""
    need = "training on the recorded logprobs"
    if not engine.scores:
        return Check("logprobs", True, f"not checked: the {engine.name} engine samples nothing", need)
    deltas: list[float] = []
    for i, c in enumerate(trace["calls"]):
        if c["response_ids"] and not c.get("error"):
            rescored = await engine.score(call_prompt_ids(trace, i), c["response_ids"])
            deltas += [abs(a - b) for a, b in zip(c["response_logprobs"], rescored, strict=True)]
    if not deltas:
        return Check("logprobs", False, "not checked: no call sampled a token", need)
    mean, worst = sum(deltas) / len(deltas), max(deltas)
    mode = engine.logprobs_mode
    raw = mean < RAW_MEAN_TOLERANCE and (mode is None or not str(mode).startswith("processed"))
    detail = (f"{'raw' if raw else 'NOT raw'}: mean |Δ| {mean:.1e}, max {worst:.1e} over {len(deltas)} sampled tokens "
              "re-scored at temperature 1") + (f"; vLLM logprobs mode {mode}" if mode else "")  # fmt: skip
    return Check("logprobs", raw, detail, need)
