"""Scripted solutions of a few MiniWoB++ tasks, acting as a user would over CDP (mouse and keyboard events on the
page, scripts only to read it): `hrl tasks validate` checks with them that a solved page scores 1.

`SOLUTIONS` maps a task name to `async def solve(page: Page)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from hrl.runners.browser import CDP, BrowserError

__all__ = ["SOLUTIONS", "Page", "solve"]


class Page:
    """The agent's side: its own CDP connection, attached to the task's page."""

    def __init__(self, cdp: CDP, session: str) -> None:
        self.cdp, self.session = cdp, session

    @classmethod
    async def open(cls, cdp_url: str, page_url: str) -> Page:
        cdp = await CDP.connect(cdp_url)
        targets = (await cdp.call("Target.getTargets"))["targetInfos"]
        page = next((t for t in targets if t["type"] == "page" and t["url"] == page_url), None)
        if page is None:
            await cdp.close()
            raise BrowserError(f"no page at {page_url} in the browser")
        attached = await cdp.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        return cls(cdp, attached["sessionId"])

    async def read(self, expression: str) -> Any:
        reply = await self.cdp.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise BrowserError(f"the page raised {reply['exceptionDetails'].get('text')} on {expression[:80]!r}")
        return reply.get("result", {}).get("value")

    async def click(self, selector: str) -> None:
        box = await self.read(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                              f".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")  # fmt: skip
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            await self.cdp.call("Input.dispatchMouseEvent", self.session, type=kind, x=x, y=y, button="left",
                                clickCount=1)  # fmt: skip

    async def type(self, text: str) -> None:
        await self.cdp.call("Input.insertText", self.session, text=text)

    async def close(self) -> None:
        await self.cdp.close()


async def _click_test(page: Page) -> None:
    await page.click("#subbtn")


async def _click_button(page: Page) -> None:
    query = await page.read("document.querySelector('#query').innerText")
    label = re.search(r'"(.*)"', query).group(1)  # type: ignore[union-attr]
    index = await page.read(
        f"[...document.querySelectorAll('#area button')].findIndex(b => b.innerText === {json.dumps(label)})"
    )
    await page.click(f"#area button:nth-of-type({index + 1})")


async def _enter_text(page: Page) -> None:
    query = await page.read("document.querySelector('#query .bold').innerText")
    await page.click("#tt")
    await page.type(query)
    await page.click("#subbtn")


async def _focus_text(page: Page) -> None:
    await page.click("#tt")


async def _click_checkboxes(page: Page) -> None:
    query = await page.read("document.querySelector('#query').innerText")
    wanted = set(re.match(r"Select (.*) and click Submit\.", query).group(1).split(", "))  # type: ignore[union-attr]
    labels = await page.read("[...document.querySelectorAll('#boxes label')].map(l => l.innerText.trim())")
    for i, label in enumerate(labels):
        if label in wanted:
            await page.click(f"#ch{i}")
    await page.click("#subbtn")


SOLUTIONS: dict[str, Callable[[Page], Awaitable[None]]] = {
    "click-test": _click_test,
    "click-button": _click_button,
    "enter-text": _enter_text,
    "focus-text": _focus_text,
    "click-checkboxes": _click_checkboxes,
}


async def solve(name: str, cdp_url: str, page_url: str) -> None:
    """Solve task `name` on the page at `page_url` of the browser at `cdp_url`; KeyError when none is scripted."""
    fn = SOLUTIONS[name]
    page = await Page.open(cdp_url, page_url)
    try:
        await fn(page)
    finally:
        await page.close()
