"""A MiniWoB++ episode's final state, for `hrl regrade`: the inputs its page received, recorded as they happened and
replayed on a fresh page of the same task and seed.

A page is generated from its seed, so the same inputs in the same order on a fresh page of that seed end it the same
way: regrading replays them and reads the reward again, as the tests verifier applies an archived diff to a fresh
checkout. What the page received is what any agent does to it, whatever its tools (Playwright, a CLI's browser MCP
server, raw CDP), so one recorder serves every harness.

Recording (`record`): hrl's own CDP session adds listeners, in capture phase, to the page's document from an isolated
world of its own (the page's scripts and the agent's main-world scripts cannot see them):

    press         a real mouse button pressed on an element (`mousedown`, trusted): the element's path from <html>,
                  the point inside it, the button and click count; replayed as a real press and release there
    script-click  a click a script made (`click`, not trusted); replayed as `element.click()`
    value         the value of a text field, text area or select after `input`/`change` (consecutive ones on one
                  field kept as the last); replayed by setting it and firing `input` and `change`
    key           a real Enter, Tab, Escape, Space (outside a text field), arrow, Home, End, PageUp or PageDown
                  (characters typed are in `value`); replayed as a key press on the element that had the focus
    focus         an element took the focus; replayed as `element.focus()` (a no-op after a press that focused it)

Each input keeps its time (ms since the episode started); the replay waits the recorded gap between two inputs, at
most REPLAY_GAP_S, and stops as soon as the page has ended its episode. Not seen, so not replayed: a change a script
makes without an event (`checkbox.checked = true`), and drags (mouse moves are not recorded). The recorder is a
consistency check, not a guard: an agent with CDP could reach the isolated world; the reward itself is guarded as
`miniwob.py` says. At most MAX_INPUTS inputs are kept; an episode with more cannot be regraded (`cut`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hrl.runners.browser import CDP, BrowserError

__all__ = ["MAX_INPUTS", "REPLAY_GAP_S", "Recorder", "inputs_json", "record", "replay"]

MAX_INPUTS = 2000
REPLAY_GAP_S = 2.0
WORLD = "hrl-inputs"

_RECORDER = """(() => {
  if (window.hrlInputs) return true;
  const log = window.hrlInputs = [];
  window.hrlInputsCut = false;
  const t0 = performance.now();
  const at = () => Math.round(performance.now() - t0);
  const path = (el) => {
    const p = [];
    while (el && el !== document.documentElement && el.parentElement) {
      p.unshift(Array.prototype.indexOf.call(el.parentElement.children, el));
      el = el.parentElement;
    }
    return p;
  };
  const push = (entry) => {
    if (log.length >= MAX_INPUTS) { window.hrlInputsCut = true; return; }
    log.push(entry);
  };
  const textual = (el) => el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement ||
    (el instanceof HTMLInputElement && !['checkbox', 'radio', 'button', 'submit', 'reset', 'file', 'image']
      .includes(el.type));
  document.addEventListener('mousedown', (e) => {
    if (!e.isTrusted || !(e.target instanceof Element)) return;
    const r = e.target.getBoundingClientRect();
    push({kind: 'press', path: path(e.target), tag: e.target.tagName, dx: e.clientX - r.left, dy: e.clientY - r.top,
          button: e.button, count: e.detail || 1, t: at()});
  }, true);
  document.addEventListener('click', (e) => {
    if (e.isTrusted || !(e.target instanceof Element)) return;
    push({kind: 'script-click', path: path(e.target), tag: e.target.tagName, t: at()});
  }, true);
  const value = (e) => {
    const el = e.target;
    if (!textual(el)) return;
    const entry = {kind: 'value', path: path(el), tag: el.tagName, value: el.value, t: at()};
    const last = log[log.length - 1];
    if (last && last.kind === 'value' && last.path.join() === entry.path.join()) log[log.length - 1] = entry;
    else push(entry);
  };
  document.addEventListener('input', value, true);
  document.addEventListener('change', value, true);
  const KEYS = ['Enter', 'Tab', 'Escape', ' ', 'ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'Home', 'End',
                'PageUp', 'PageDown'];
  document.addEventListener('keydown', (e) => {
    if (!e.isTrusted || !KEYS.includes(e.key)) return;
    const el = document.activeElement;
    if (e.key === ' ' && textual(el)) return;
    push({kind: 'key', key: e.key, code: e.code, keyCode: e.keyCode, path: el ? path(el) : [], t: at()});
  }, true);
  document.addEventListener('focusin', (e) => {
    if (!(e.target instanceof Element)) return;
    push({kind: 'focus', path: path(e.target), tag: e.target.tagName, t: at()});
  }, true);
  return true;
})()""".replace("MAX_INPUTS", str(MAX_INPUTS))


class Recorder:
    """The recorder of one page: its isolated world in hrl's session on the page."""

    def __init__(self, cdp: CDP, target: str, context: int) -> None:
        self.cdp, self.target, self.context = cdp, target, context

    async def inputs(self) -> dict[str, Any]:
        """What the page received so far: {"inputs": [...], "cut": bool}."""
        reply = await self.cdp.call("Runtime.evaluate", self.target, contextId=self.context, returnByValue=True,
                                    expression="({inputs: window.hrlInputs || [], cut: !!window.hrlInputsCut})")  # fmt: skip
        if "exceptionDetails" in reply:
            raise BrowserError(f"the input recorder raised: {reply['exceptionDetails'].get('text')}")
        value = reply.get("result", {}).get("value")
        if not isinstance(value, dict):
            raise BrowserError("the input recorder is gone (the page was replaced)")
        return value


async def _world(cdp: CDP, target: str) -> int:
    """A new isolated world of hrl's in the page's main frame: its execution context id."""
    tree = await cdp.call("Page.getFrameTree", target)
    made = await cdp.call("Page.createIsolatedWorld", target, frameId=tree["frameTree"]["frame"]["id"], worldName=WORLD)
    return int(made["executionContextId"])


async def record(cdp: CDP, target: str) -> Recorder:
    """Start recording the page's inputs (before the agent gets the page); raises BrowserError."""
    context = await _world(cdp, target)
    reply = await cdp.call("Runtime.evaluate", target, contextId=context, expression=_RECORDER, returnByValue=True)
    if reply.get("result", {}).get("value") is not True:
        raise BrowserError(f"the input recorder did not start: {reply.get('exceptionDetails', {}).get('text')}")
    return Recorder(cdp, target, context)


def inputs_json(recorded: dict[str, Any]) -> str:
    """The recorded inputs as the episode's archived final state (the verdict's `patch`): one JSON document."""
    return json.dumps({"format": "hrl.miniwob-inputs/1", **recorded}, separators=(",", ":"))


_FIND = """(() => {
  let el = document.documentElement;
  for (const i of %s) { el = el && el.children[i]; }
  return el || null;
})()"""


async def _element(cdp: CDP, target: str, context: int, entry: dict[str, Any]) -> str:
    """The remote object id of the element at `entry`'s path on the replayed page; BrowserError when the page has
    none there, or another kind of element (the page differs from the recorded one)."""
    reply = await cdp.call("Runtime.evaluate", target, contextId=context, expression=_FIND % json.dumps(entry["path"]))
    found = reply.get("result", {})
    if found.get("subtype") == "null" or "objectId" not in found:
        raise BrowserError(f"the replayed page has no element at {entry['path']} ({entry.get('tag', '?')})")
    tag = await _on(cdp, target, found["objectId"], "function() { return this.tagName; }")
    if entry.get("tag") and tag != entry["tag"]:
        raise BrowserError(f"the replayed page has a {tag} at {entry['path']}, the recorded one a {entry['tag']}")
    return str(found["objectId"])


async def _on(cdp: CDP, target: str, obj: str, fn: str, *args: Any) -> Any:
    reply = await cdp.call("Runtime.callFunctionOn", target, objectId=obj, functionDeclaration=fn,
                           arguments=[{"value": a} for a in args], returnByValue=True)  # fmt: skip
    if "exceptionDetails" in reply:
        raise BrowserError(f"the replay raised: {reply['exceptionDetails'].get('text')}")
    return reply.get("result", {}).get("value")


_KEY_TEXT = {"Enter": "\r", " ": " "}
_BUTTONS = {0: "left", 1: "middle", 2: "right"}


async def _do(cdp: CDP, target: str, context: int, entry: dict[str, Any]) -> None:
    kind = entry.get("kind")
    if kind == "key":
        if entry.get("path"):
            await _on(cdp, target, await _element(cdp, target, context, entry), "function() { this.focus(); }")
        common = {"key": entry["key"], "code": entry.get("code", ""), "windowsVirtualKeyCode": entry.get("keyCode", 0)}
        text = _KEY_TEXT.get(entry["key"])
        await cdp.call("Input.dispatchKeyEvent", target, type="keyDown" if text else "rawKeyDown",
                       **common, **({"text": text} if text else {}))  # fmt: skip
        await cdp.call("Input.dispatchKeyEvent", target, type="keyUp", **common)
        return
    obj = await _element(cdp, target, context, entry)
    if kind == "press":
        x, y = await _on(
            cdp, target, obj, "function() { const r = this.getBoundingClientRect(); return [r.left, r.top]; }"
        )
        point = {"x": x + float(entry["dx"]), "y": y + float(entry["dy"])}
        button, count = _BUTTONS.get(int(entry.get("button", 0)), "left"), int(entry.get("count", 1))
        await cdp.call("Input.dispatchMouseEvent", target, type="mouseMoved", **point)
        for phase in ("mousePressed", "mouseReleased"):
            await cdp.call("Input.dispatchMouseEvent", target, type=phase, button=button, clickCount=count, **point)
    elif kind == "script-click":
        await _on(cdp, target, obj, "function() { this.click(); }")
    elif kind == "value":
        await _on(cdp, target, obj, "function(v) { this.focus(); this.value = v; "
                  "this.dispatchEvent(new Event('input', {bubbles: true})); "
                  "this.dispatchEvent(new Event('change', {bubbles: true})); }", entry.get("value", ""))  # fmt: skip
    elif kind == "focus":
        await _on(cdp, target, obj, "function() { this.focus(); }")
    else:
        raise BrowserError(f"an input of unknown kind {kind!r} was recorded")


async def replay(cdp: CDP, target: str, recorded: str, ended: Any) -> int:
    """Replay the inputs of `recorded` (`inputs_json`'s document) on a fresh page of the same task and seed, in
    order, until `ended()` says the page ended its episode; returns how many were replayed. Raises BrowserError
    when the page differs from the recorded one, ValueError when `recorded` is not such a document."""
    doc = json.loads(recorded)
    if not isinstance(doc, dict) or doc.get("format") != "hrl.miniwob-inputs/1":
        raise ValueError("not a recording of a page's inputs (hrl.miniwob-inputs/1)")
    if doc.get("cut"):
        raise ValueError(f"the recording was cut at {MAX_INPUTS} inputs")
    context = await _world(cdp, target)
    previous, done = 0, 0
    for entry in doc.get("inputs", []):
        if ended():
            break
        gap = (int(entry.get("t", previous)) - previous) / 1000
        previous = int(entry.get("t", previous))
        if gap > 0:
            await asyncio.sleep(min(gap, REPLAY_GAP_S))
        await _do(cdp, target, context, entry)
        done += 1
    return done
