"""An episode as the agent lived it, for `hrl inspect --trace` and `hrl report`: each model call in order with what
it was shown new (the task, then the tool results and messages the agent added), what the model said (decoded from
the recorded ids with the model's tokenizer and split into reasoning, text and tool calls by the proxy's own
parsers), the tool events that followed, and the outcome (reward, tests, the test log).

The trace stores token ids only (text is for humans: the design's "token in, token out"), so the words need the
model's tokenizer. Without one the same structure comes back with `decoded: false`, token counts in place of text
and a `note` saying why. Long texts are cut to `max_lines` with a visible "… N more lines" line, in one place, so
the terminal, `--json` and the HTML report cut alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hrl.runners.errors import UsageError
from hrl.runners.models import model_file
from hrl.runners.summary import describe_calls
from hrl.runners.trace import trace_success

__all__ = ["MORE", "conversation", "cut", "decoding_template", "image_mark", "info_text", "load_template", "model_of"]

Trace = dict[str, Any]
MORE = "… {n} more lines"
_LINE_CHARS = 400  # a line longer than this counts as several when cutting (minified output, a one-line log)
_OUTCOME_KEYS = ("tests", "log")  # reward_info entries shown as blocks of their own, not as a one-line summary


def cut(text: str, max_lines: int | None) -> str:
    """`text` whole (`max_lines` None), or its first lines with one last line saying how many more there were. A
    very long line counts as `len / _LINE_CHARS` lines, so one 1 MB line is cut too."""
    if max_lines is None:
        return text
    lines = text.splitlines()
    budget, kept = max_lines * _LINE_CHARS, []
    for line in lines[:max_lines]:
        if budget <= 0:
            break
        kept.append(line if len(line) <= budget else line[:budget] + "…")
        budget -= max(len(line), 1)
    more = len(lines) - len(kept)
    return "\n".join(kept) + ("\n" + MORE.format(n=more) if more else "")


def model_of(traces: list[Trace], config: dict[str, Any] | None = None) -> list[str]:
    """The models whose tokenizer may decode these traces, to try in order: a run's configured model (as the
    recipe named it), then those the traces name (the path the run served, `hrl:` names already built)."""
    config = config or {}
    named = [config.get("model"), (config.get("trainer") or {}).get("model")]
    named += [(t.get("model") or {}).get("name") for t in traces]
    return list(dict.fromkeys(str(n) for n in named if n))


def _local_dir(model: str) -> Path | None:
    """A directory holding the model's tokenizer: the path itself, or its snapshot in the local HF cache (never
    fetched, so decoding works offline and never waits on the network)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    found = model_file(model, "tokenizer_config.json")
    return found.parent if found is not None else None


def load_template(model: str | list[str] | None, proxy: dict[str, Any] | None = None) -> tuple[Any, str | None]:
    """(the proxy's `ChatTemplate` for `model`, None), or (None, why not) when there is no tokenizer to load.
    `model`: a name, or several to try in order (`model_of`). `proxy`: a run's proxy settings, so its
    `tool_parser` / `reasoning_parser` split replies as the run did."""
    names = [model] if isinstance(model, str) else list(model or [])
    if not names:
        return None, "the traces name no model"
    first: tuple[Any, str | None] | None = None
    for name in names[:8]:  # a run names one or two models; the first that loads wins
        template, note = _load(name, proxy or {})
        if template is not None:
            return template, None
        first = first or (None, note)
    return first or (None, None)


def decoding_template(traces: list[Trace], config: dict[str, Any], model: str | None) -> tuple[Any, str | None]:
    """The template that decodes `traces` (`model`, else the run's or the traces' model; `config`: the run's), and
    why there is none (None when there is). A UsageError when an explicit `model` cannot be loaded."""
    template, note = load_template(model or model_of(traces, config), config.get("proxy"))
    if template is None and model is not None:
        raise UsageError(f"cannot decode with --model {model}: {note}", hint="give a model directory or a cached HF id")
    return template, note


def _load(model: str, proxy: dict[str, Any]) -> tuple[Any, str | None]:
    where = _local_dir(model)
    if where is None:
        return None, f"no tokenizer for model {model!r} on this machine"
    from hrl.runners.proxy.template import ChatTemplate

    try:
        template = ChatTemplate(
            str(where), str(proxy.get("tool_parser") or "auto"), str(proxy.get("reasoning_parser") or "auto")
        )
    except Exception as e:  # a dir without a tokenizer or a chat template: show the trace without text
        return None, f"cannot load the tokenizer of {model!r} ({str(e).splitlines()[0][:200]})"
    return template, None


def conversation(
    trace: Trace, template: Any = None, max_lines: int | None = 40, note: str | None = None
) -> dict[str, Any]:
    """The episode as a JSON-able dict: `calls` in the order they were made, each with its timing, `input` (the
    tokens its prompt added: the whole prompt for a first call, else what came after the earlier call it extends:
    tool results, new messages), `reply` (reasoning, text, tool calls with their arguments) and the `tools` run
    after it; then `outcome`. `template`: a `ChatTemplate` (None: no text, `note` says why)."""
    calls = trace.get("calls") or []
    rows = describe_calls(trace)
    tools = _tools_by_call(calls, trace.get("tools") or [])
    turns = []
    for i, (c, row) in enumerate(zip(calls, rows, strict=True)):
        turn = {k: row[k] for k in ("call_id", "agent", "parent", "side", "started_at", "first_token_s", "total_s",
                                    "prompt_tokens", "response_tokens", "finish_reason", "versions", "error",
                                    "tool_parse_error")}  # fmt: skip
        turn |= {"input": _input(c, template, max_lines), "reply": _reply(c, template, max_lines), "tools": tools[i],
                 "media": c.get("media") or []}  # fmt: skip
        turns.append(turn)
    return {
        "trace_id": str(trace["trace_id"]),
        "session": trace.get("session"),
        "task_id": trace.get("task_id"),
        "model": (trace.get("model") or {}).get("name"),
        "decoded": template is not None,
        "note": None if template is not None else note or "no tokenizer given",
        "calls": turns,
        "outcome": _outcome(trace, max_lines),
    }


def image_mark(m: dict[str, Any]) -> str:
    """How an image stands in a decoded text: its hash, type and size, once, in place of the engine's expanded
    placeholder run (hundreds of image tokens in a real vision model, which decoded would read as words)."""
    return f"[image {str(m.get('sha256', ''))[:12]} {m.get('mime', '?')} {m.get('width')}×{m.get('height')}]"


def _input(call: dict[str, Any], template: Any, max_lines: int | None) -> dict[str, Any]:
    """What this call's prompt adds: after `after` tokens of call `since` (its parent, or the earlier call it shares
    the longest prefix with), or the whole prompt (`since` None). `media`: the images whose placeholder runs lie in
    what it adds (an image re-sent in the history belongs to the call that first added it); `parts`: the text
    between them and the images in order (`{"type": "text", "text"}` / `{"type": "image", "media"}`), and `text`
    the same with each image as `image_mark`."""
    ref = call.get("prompt_ref")
    ids = list(call.get("prompt_suffix_ids") or []) if ref else list(call.get("prompt_ids") or [])
    after = ref["length"] if ref else 0
    out: dict[str, Any] = {"since": ref["call_id"] if ref else None, "after": after}
    out["tokens"] = len(ids)
    media = sorted((m for m in call.get("media") or [] if _inside(m, after, len(ids))),
                   key=lambda m: m["placeholder"][0])  # fmt: skip
    out["media"] = media
    if template is None:
        out["text"], out["parts"] = None, None
        return out
    parts: list[dict[str, Any]] = []
    at = 0
    for m in media:
        offset, length = _span(m, after)
        parts.append({"type": "text", "text": template.decode(ids[at:offset])})
        parts.append({"type": "image", "media": m})
        at = offset + length
    parts.append({"type": "text", "text": template.decode(ids[at:])})
    parts[0]["text"], parts[-1]["text"] = parts[0]["text"].lstrip(), parts[-1]["text"].rstrip()  # as `text` is
    parts = [p for p in parts if p["type"] == "image" or p["text"]]
    out["text"] = cut("".join(p["text"] if p["type"] == "text" else image_mark(p["media"]) for p in parts).strip(),
                      max_lines)  # fmt: skip
    out["parts"] = parts if media else None
    return out


def _span(m: dict[str, Any], after: int) -> tuple[int, int]:
    """An image's placeholder run as (offset into what the call added, length)."""
    offset, length = m["placeholder"]
    return int(offset) - after, int(length)


def _inside(m: dict[str, Any], after: int, n: int) -> bool:
    placeholder = m.get("placeholder")
    if not placeholder:
        return False
    offset, length = _span(m, after)
    return offset >= 0 and offset + length <= n


def _reply(call: dict[str, Any], template: Any, max_lines: int | None) -> dict[str, Any]:
    """The reply as the proxy parsed it when it answered the agent (`parse_reply`): tool calls only when it found
    some (finish `tool_calls`) or failed to read one; the request's tool schemas are not in the trace, so
    arguments are as the model wrote them."""
    if template is None:
        return {"reasoning": None, "text": None, "tool_calls": []}
    from hrl.runners.proxy.template import parse_reply

    text = template.reply_text(call["response_ids"])
    parsed = call.get("finish_reason") == "tool_calls" or bool(call.get("tool_parse_error"))
    reply = parse_reply(template, text, tool_calls=parsed, tools=None)
    return {
        "reasoning": cut(reply.reasoning.strip(), max_lines) or None,
        "text": cut(reply.content.strip(), max_lines) or None,
        "tool_calls": [
            {"name": tc["function"]["name"], "arguments": cut(tc["function"]["arguments"], max_lines)}
            for tc in reply.tool_calls
        ],
    }


def _tools_by_call(calls: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each tool event under the call whose response asked for it: the last call to end at or before the tool
    started (both times are rounded to the millisecond in the trace)."""
    out: list[list[dict[str, Any]]] = [[] for _ in calls]
    ends = [float(c.get("ended_at") or 0.0) for c in calls]
    for t in sorted(tools, key=lambda t: float(t.get("started_at") or 0.0)):
        start = float(t.get("started_at") or 0.0)
        before = [i for i, end in enumerate(ends) if end <= start + 1e-3]
        if before:
            at = max(before, key=lambda i: (ends[i], i))
            dur = max(0.0, float(t.get("ended_at") or start) - start)
            out[at].append({"name": t.get("name"), "tool_call_id": t.get("tool_call_id"), "started_at": start,
                            "duration_s": round(dur, 3)})  # fmt: skip
    return out


def _outcome(trace: Trace, max_lines: int | None) -> dict[str, Any]:
    """Reward, success, the failure, the verifier's numbers, each test's outcome and the test output's tail."""
    info = trace.get("reward_info") or {}
    tests = info.get("tests")
    log = info.get("log")
    return {
        "status": trace.get("status"),
        "failure_reason": trace.get("failure_reason"),
        "reward": trace.get("reward"),
        "success": trace_success(trace),
        "info": {k: v for k, v in info.items() if k not in _OUTCOME_KEYS},
        "tests": tests if isinstance(tests, dict) else None,
        "log": cut(log.rstrip(), max_lines) if isinstance(log, str) and log.strip() else None,
    }


def info_text(info: dict[str, Any]) -> str:
    """The verifier's other numbers on one line: `fail_to_pass 2/2 · exit_code 1 · …`."""
    parts = []
    for k, v in info.items():
        if isinstance(v, dict) and {"passed", "total"} <= v.keys():
            parts.append(f"{k} {v['passed']}/{v['total']}")
        else:
            parts.append(f"{k} {v if isinstance(v, str | int | float | bool) else json.dumps(v)}")
    return " · ".join(parts)
