"""A trace's conversation (`hrl.runners.conversation`) as HTML for the report: one `<details>` per call (open, so
it reads top to bottom; click its line to fold it), texts in `<pre>` with their real newlines, the outcome last.

Each trace's HTML sits in an inert `<template class="conversation" data-n=N>` that the page clones into the
trace's detail when it is opened, so hundreds of conversations cost no layout until then.
"""

from __future__ import annotations

import base64
import io
from html import escape
from pathlib import Path
from typing import Any

from hrl.runners.conversation import conversation, info_text

__all__ = ["BUDGET_CHARS", "MAX_IMAGES", "MAX_LINES", "conversation_html", "conversation_templates", "thumbnails"]

MAX_LINES = 30  # lines of one text in the report (the page holds every trace): `hrl inspect --full` shows all
BUDGET_CHARS = 24_000_000  # decoded text the page holds, all traces together; later traces show counts only
MAX_IMAGES = 256  # distinct images the page shows as thumbnails (JPEG, 160 px); later ones by their caption only
THUMB_PX = 160


def thumbnails(images: dict[str, Path], limit: int = MAX_IMAGES) -> dict[str, str]:
    """sha256 → a small JPEG data URL of each stored image (`media/<sha256>` beside the traces), the first `limit`;
    an image whose file is missing or unreadable gets none (its caption says so)."""
    out: dict[str, str] = {}
    for sha, path in list(images.items())[:limit]:
        try:
            from PIL import Image

            with Image.open(path) as img:
                img.thumbnail((THUMB_PX, THUMB_PX))
                buf = io.BytesIO()
                img.convert("RGB").save(buf, "JPEG", quality=80)
        except (ImportError, OSError, ValueError):
            continue
        out[sha] = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    return out


def _secs(s: float | None) -> str:
    return "–" if s is None else f"{s:.2f}s"


def _block(cls: str, label: str, text: str | None) -> str:
    if not text:
        return ""
    return (
        f'<div class="block {cls}"><div class="label">{escape(label)}</div><pre>{escape(text, quote=False)}</pre></div>'
    )


def _summary(turn: dict[str, Any]) -> str:
    """The call's line: id, agent, start, tokens, finish, timing, parent."""
    parts = [f"<b>{escape(turn['call_id'])}</b>"]
    if turn["agent"]:
        parts.append(f"agent {escape(turn['agent'])}")
    parts.append(f"@{_secs(turn['started_at'])}")
    parts.append(f"{turn['prompt_tokens']}→{turn['response_tokens']} tokens")
    parts.append(escape(str(turn["finish_reason"])) + (" · side" if turn["side"] else ""))
    parts.append(f"first token {_secs(turn['first_token_s'])} · total {_secs(turn['total_s'])}")
    parts.append(",".join(f"v{v}" for v in turn["versions"]) or "v–")
    if turn["parent"]:
        parts.append(f"← {escape(turn['parent'])}")
    return " · ".join(parts)


def _image(m: dict[str, Any], thumbs: dict[str, str]) -> str:
    """One image of a call's prompt: its thumbnail (when stored and within the page's budget) and caption."""
    offset, length = m.get("placeholder") or ("?", "?")
    caption = (f"image {m['sha256'][:12]} · {m.get('mime', '')} {m.get('width')}×{m.get('height')} · "
               f"{m.get('bytes')} B · prompt tokens {offset}+{length}")  # fmt: skip
    thumb = thumbs.get(m["sha256"])
    img = f'<img src="{thumb}" alt="{escape(m["sha256"])}">' if thumb else '<span class="muted">(not shown)</span>'
    return f'<figure class="image">{img}<figcaption>{escape(caption)}</figcaption></figure>'


def _turn(turn: dict[str, Any], thumbs: dict[str, str] | None = None) -> str:
    given, reply = turn["input"], turn["reply"]
    since = given["since"]
    head = f"prompt ({given['tokens']} tokens)" if since is None else f"+{given['tokens']} prompt tokens after {since}"
    head += "" if since is None else " (tool results, new messages)"
    body = [_block("input", head, given["text"]) or f'<div class="label">{escape(head)}</div>']  # no text: counts
    body += [_image(m, thumbs or {}) for m in turn.get("media") or []]
    body.append(_block("reasoning", "reasoning", reply["reasoning"]))
    body.append(_block("says", "says", reply["text"]))
    body += [_block("toolcall", f"tool call {c['name']}", c["arguments"]) for c in reply["tool_calls"]]
    body += [
        f'<div class="tool">tool {escape(str(t["name"]))} @{_secs(t["started_at"])} ran {_secs(t["duration_s"])}</div>'
        for t in turn["tools"]
    ]
    for key, label in (("error", "error"), ("tool_parse_error", "tool call not parsed (sent as text)")):
        if turn[key]:
            body.append(f'<div class="err">{escape(label)}: {escape(str(turn[key]))}</div>')
    return (
        f'<details class="turn" open data-call="{escape(turn["call_id"])}"><summary>{_summary(turn)}</summary>'
        f"{''.join(body)}</details>"
    )


def _outcome(outcome: dict[str, Any]) -> str:
    reward = "–" if outcome["reward"] is None else f"{outcome['reward']:g}"
    success = {True: "yes", False: "no", None: "–"}[outcome["success"]]
    line = f"<b>reward {reward}</b> · success {success}"
    if outcome["failure_reason"]:
        line += f' · <span class="err">failed: {escape(outcome["failure_reason"])}</span>'
    if info := info_text(outcome["info"]):
        line += f" · {escape(info)}"
    parts = [f'<div class="outcome-line">{line}</div>']
    if tests := outcome["tests"]:
        rows = sorted(tests.items(), key=lambda kv: (kv[1] in ("PASSED", "XFAIL"), kv[0]))
        ok = sum(o in ("PASSED", "XFAIL") for o in tests.values())
        parts.append(_block("tests", f"tests: {ok}/{len(tests)} passed", "\n".join(f"{o}  {t}" for t, o in rows)))
    parts.append(_block("log", "test output", outcome["log"]))
    return f'<div class="outcome">{"".join(parts)}</div>'


def conversation_html(conv: dict[str, Any], thumbs: dict[str, str] | None = None) -> str:
    """One trace's conversation: a note when it could not be decoded, each call (with its images: `thumbs`, sha256
    → data URL), the outcome."""
    note = "" if conv["decoded"] else f'<div class="note">{escape(str(conv["note"]))}: token counts only</div>'
    turns = "".join(_turn(t, thumbs) for t in conv["calls"]) or '<div class="muted">no LLM calls</div>'
    return f'<div class="conversation">{note}{turns}{_outcome(conv["outcome"])}</div>'


def conversation_templates(
    traces: list[dict[str, Any]],
    template: Any,
    note: str | None,
    budget: int = BUDGET_CHARS,
    thumbs: dict[str, str] | None = None,
) -> str:
    """Every trace's conversation, in table order, each in an inert `<template>` the page opens on demand; decoded
    with `template` (a `ChatTemplate`, None: counts only, `note` says why) until `budget` characters are spent, so a
    run of thousands of long episodes still makes a page a browser opens."""
    out, spent = [], 0
    for n, trace in enumerate(traces):
        if template is not None and spent > budget:
            template, note = None, f"the report's {budget:,} characters of text are spent (hrl inspect shows it)"
        html = conversation_html(conversation(trace, template, max_lines=MAX_LINES, note=note), thumbs)
        spent += len(html)
        out.append(f'<template class="conversation" data-n="{n}">{html}</template>')
    return "".join(out)
