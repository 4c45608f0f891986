"""A white-box browser agent: it reads the page's accessibility snapshot (text), asks the model for one action, and
acts on the page over CDP (Playwright connected to the episode's own Chromium), a few steps at most.

The episode's browser is hrl's (started by the `miniwob` verifier); `session.browser` holds its DevTools endpoint and
the page's address. The page, not this agent, says the reward: the verifier reads it at the end.

Actions the model may answer with, one per reply:  click TEXT  |  type TEXT  |  done
(`click` takes a control named TEXT, a button or a link, before any other text showing TEXT.)
(`type` fills the focused or first text field, then the agent presses nothing else: the model clicks Submit itself.)
"""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import async_playwright

STEPS = 4
SYSTEM = (
    "You operate a web page. Each turn you see the page's accessibility snapshot. Reply with exactly one action: "
    "`click TEXT` (click the element showing TEXT), `type TEXT` (type TEXT into the text field), or `done`."
)


def observation(snapshot: str) -> str:
    """One turn's user message: the page's accessibility snapshot, cut to its first 3000 characters."""
    return f"Page:\n{snapshot[:3000]}\nYour action?"


async def run(task: Any, session: Any) -> float | None:
    info = session.browser  # the episode's browser: {cdp_url, page_url}
    client = session.openai(max_retries=0)
    async with async_playwright() as pw:
        browser = await pw.chromium.connect_over_cdp(info["cdp_url"])
        page = next(p for c in browser.contexts for p in c.pages if p.url == info["page_url"])
        messages = [{"role": "system", "content": SYSTEM}]
        for _ in range(STEPS):
            snapshot = await page.locator("body").aria_snapshot(timeout=5000)
            messages.append({"role": "user", "content": observation(snapshot)})
            reply = await client.chat.completions.create(model=session.model, messages=messages, max_tokens=32)
            action = (reply.choices[0].message.content or "").strip()
            messages.append({"role": "assistant", "content": action})
            if not await _act(page, action):
                break
        await browser.close()  # closes the connection only: the browser is hrl's, stopped by the verifier
    return None


async def _act(page: Any, action: str) -> bool:
    """Do `action`; False ends the episode (done, or a reply that is no action)."""
    if m := re.match(r"click\s+(.+)", action, re.I):
        try:
            target = await _clickable(page, m.group(1).strip().strip('"'))
        except Exception:  # a name no selector can hold: no such element, the step is spent
            return True
    elif m := re.match(r"type\s+(.+)", action, re.I):
        target = page.locator("input[type=text], textarea").first
        try:
            await target.fill(m.group(1).strip().strip('"'), timeout=2000)
        except Exception:  # no such field: the step is spent, the episode goes on
            pass
        return True
    else:
        return False
    try:
        await target.click(timeout=2000)
    except Exception:  # no such element: the step is spent
        pass
    return True


CLICKABLE = ("button", "link", "checkbox", "radio", "tab", "menuitem", "option")


async def _clickable(page: Any, text: str) -> Any:
    """The element `click TEXT` means: a control named TEXT (a button, link, checkbox, …) before any text showing
    it, which would otherwise be the page's instruction (`Click on the "Ok" button.`) when that comes first. A name
    matches in its own case first, then in any case (`click ok` is the button `Ok`, never the button `Okay`)."""
    escaped = re.escape(text).replace("/", r"\/")  # Playwright hands JavaScript /source/flags: "/" ends the source
    anycase = re.compile(rf"^\s*{escaped}\s*$", re.I)
    for name in (text, anycase):
        for role in CLICKABLE:
            control = page.get_by_role(role, name=name, exact=True)  # exact is ignored for a pattern
            if await control.count():
                return control.first
    exact = page.get_by_text(text, exact=True)
    return exact.first if await exact.count() else page.get_by_text(text, exact=False).first
