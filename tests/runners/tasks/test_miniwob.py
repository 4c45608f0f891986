"""MiniWoB++ tasks: loaded from the miniwob package, graded from the page by a real headless Chromium (`browser`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from hrl.runners.browser import BrowserError, live_in_group
from hrl.runners.tasks.load import load_tasks
from hrl.runners.tasks.miniwob import MiniWoBVerifier, load_miniwob, read_reward, start_page
from hrl.runners.tasks.miniwob_solutions import Page, solve
from hrl.runners.tasks.task import TaskFormatError
from hrl.runners.tasks.validate import validate_tasks_async
from hrl.sandboxes.base import SandboxSpec
from hrl.sandboxes.local import LocalBackend

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

SOLVED = "click-test,click-button,enter-text,focus-text,click-checkboxes"


@pytest.fixture(autouse=True)
def own_temp_folder(monkeypatch: pytest.MonkeyPatch):
    """Each test's browsers keep their profiles in a temp folder of the test's own, so that `_gone` looks for this
    test's browsers only (other test files run browsers at the same time)."""
    where = tempfile.mkdtemp(prefix="hrl-mw-", dir="/tmp")  # short: Chromium's sockets live under it
    monkeypatch.setattr(tempfile, "tempdir", where)
    yield
    shutil.rmtree(where, ignore_errors=True)


def _gone(pid: int) -> bool:
    """No process of the browser's group runs (nor any with a profile of this test's on its command line)."""
    mine = f"{tempfile.gettempdir()}/hrl-chromium-"
    return not live_in_group(pid) and not any(mine in _cmdline(p) for p in Path("/proc").glob("[0-9]*"))


def _cmdline(proc: Path) -> str:
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return ""
        return (proc / "cmdline").read_text()
    except (OSError, IndexError):
        return ""


def test_specs_load_pages_and_seeds() -> None:
    tasks = load_tasks("miniwob:click-test,enter-text:3")
    assert [t.instance_id for t in tasks] == [
        f"miniwob.{n}.s{s}" for n in ("click-test", "enter-text") for s in range(3)
    ]
    assert {t.seed for t in tasks} == {0, 1, 2}
    assert len(load_miniwob("miniwob:*")) > 100  # every page of the package
    with pytest.raises(TaskFormatError, match="no MiniWoB"):
        load_miniwob("miniwob:click-tset")
    with pytest.raises(TaskFormatError, match="SEEDS"):
        load_miniwob("miniwob:click-test:0")


def test_five_tasks_validate_solution_one_noop_zero() -> None:
    checks = asyncio.run(validate_tasks_async(load_tasks(f"miniwob:{SOLVED}"), concurrency=1))
    assert [c.problems for c in checks] == [[]] * 5
    assert [(c.gold.reward, c.empty.reward) for c in checks] == [(1.0, 0.0)] * 5  # type: ignore[union-attr]


def test_same_seed_same_problem_other_seed_other() -> None:
    async def query(seed: int) -> str:
        ep = await start_page(load_miniwob(f"miniwob:enter-text:{seed + 1}")[seed], 60)
        try:
            page = await Page.open(ep.browser.cdp_url, ep.page_url)
            text = await page.read("document.querySelector('#query').innerText")
            await page.close()
            return str(text)
        finally:
            await ep.stack.aclose()

    async def main() -> list[str]:
        return [await query(0), await query(0), await query(1)]

    first, again, other = asyncio.run(main())
    assert first == again != other


@pytest.mark.parametrize(
    "script", ["core.endEpisode(1.0)", "WOB_REWARD_GLOBAL = 1; WOB_RAW_REWARD_GLOBAL = 1; WOB_DONE_GLOBAL = true",
               "document.querySelector('#query').addEventListener('click', () => core.endEpisode(1.0)); 0"],
)  # fmt: skip
def test_a_reward_the_agent_scripts_is_refused(script: str) -> None:
    """An agent with CDP can run code in the page: a reward its own code produced scores 0 and is flagged."""

    async def main() -> tuple[float | None, dict]:
        ep = await start_page(load_miniwob("miniwob:enter-text")[0], 60)
        try:
            page = await Page.open(ep.browser.cdp_url, ep.page_url)
            await page.read(script)
            if "addEventListener" in script:  # its listener runs on a real click, but it is the agent's code
                await page.click("#query")
            await page.close()
            await asyncio.sleep(0.2)
            verdict = await read_reward(ep)
        finally:
            await ep.stack.aclose()
        return verdict.reward, verdict.reward_info

    reward, info = asyncio.run(main())
    assert reward is not None and reward <= 0.0
    assert info["tampered"] is True


def test_the_browser_reaches_only_the_tasks_pages() -> None:
    async def main() -> dict[str, str]:
        other = web.Application()
        other.router.add_get("/", lambda r: web.Response(text="secret"))
        runner = web.AppRunner(other)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ep = await start_page(load_miniwob("miniwob:click-test")[0], 60)
        try:
            page = await Page.open(ep.browser.cdp_url, ep.page_url)
            got = {}
            for url in (ep.page_url, f"http://127.0.0.1:{port}/", "http://203.0.113.7/"):
                reply = await page.cdp.call(
                    "Runtime.evaluate", page.session, awaitPromise=True, returnByValue=True,
                    expression=f"fetch({url!r}).then(r => 'ok ' + r.status, e => 'failed')",
                )  # fmt: skip
                got[url] = reply["result"]["value"]
            await page.close()
            got["blocked"] = " ".join(ep.browser.blocked)
        finally:
            await ep.stack.aclose()
            await runner.cleanup()
        return got

    got = asyncio.run(main())
    assert list(got.values())[:3] == ["ok 200", "failed", "failed"]
    assert "127.0.0.1" in got["blocked"] and "203.0.113.7" in got["blocked"]


def test_no_browser_is_left_behind_even_when_the_episode_raises() -> None:
    singletons = lambda: set(Path(tempfile.gettempdir()).glob("org.chromium.Chromium.*"))  # noqa: E731
    before = singletons()

    async def main() -> int:
        ep = await start_page(load_miniwob("miniwob:click-test")[0], 60)
        pid = ep.browser.pid
        try:
            assert not _gone(pid)
            raise RuntimeError("the episode failed")
        except RuntimeError:
            pass
        finally:
            await ep.stack.aclose()
        return pid

    assert _gone(asyncio.run(main()))
    assert singletons() <= before  # nor the singleton folder a killed Chromium leaves in $TMPDIR


def test_an_unreachable_browser_is_a_verifier_error_not_a_zero() -> None:
    async def main() -> tuple[float | None, str | None]:
        ep = await start_page(load_miniwob("miniwob:click-test")[0], 60)
        try:
            os.killpg(ep.browser.pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
            verdict = await read_reward(ep)
        finally:
            await ep.stack.aclose()
        return verdict.reward, verdict.failure_reason

    assert asyncio.run(main()) == (None, "verifier_error")


def test_verifier_episode_in_a_local_sandbox(tmp_path: Path) -> None:
    """The verifier's own lifecycle: prepare writes browser.json for the agent, verify reads the page's reward."""
    import json

    async def main() -> tuple[list[float | None], int]:
        verifier = MiniWoBVerifier(run_id="hrl-test")
        rewards = []
        for act in (True, False):
            task = load_miniwob("miniwob:click-button")[0]
            async with await LocalBackend().create(SandboxSpec(workdir="/work"), "hrl-test", f"e{act}") as box:
                await verifier.prepare(box, task)
                info = json.loads(await box.read_file("/work/browser.json"))
                pid = verifier._episodes[box.id].browser.pid
                if act:
                    await solve("click-button", info["cdp_url"], info["page_url"])
                rewards.append((await verifier.verify(box, task)).reward)
        return rewards, pid

    rewards, pid = asyncio.run(main())
    assert rewards == [1.0, 0.0]
    assert _gone(pid)


@pytest.mark.parametrize(
    ("method", "params"),
    [("Debugger.enable", {}), ("Fetch.enable", {}), ("Page.addScriptToEvaluateOnNewDocument", {"source": "1"})],
)
def test_the_agents_endpoint_refuses_what_could_rewrite_the_task(method: str, params: dict) -> None:
    """The agent's CDP endpoint is a relay: live edits of the task's scripts, request interception and main-world
    scripts ahead of the task's are refused with a CDP error; reading the page passes."""

    async def main() -> tuple[str, object, list[str]]:
        ep = await start_page(load_miniwob("miniwob:click-test")[0], 60)
        try:
            page = await Page.open(ep.browser.cdp_url, ep.page_url)
            try:
                await page.cdp.call(method, page.session, **params)
                error = ""
            except BrowserError as e:
                error = str(e)
            title = await page.read("document.title")
            await page.close()
            return error, title, list(ep.browser.refused)
        finally:
            await ep.stack.aclose()

    error, title, refused = asyncio.run(main())
    assert "refused by hrl" in error or "isolated world" in error
    assert refused == [method] and isinstance(title, str)


def test_a_wrong_answer_the_page_scores_above_zero_is_paid_zero_unless_raw_is_asked() -> None:
    """find-greatest ends a wrong answer with +0.1 (Farama-Foundation/MiniWoB-plusplus#108): paid as it is, RL would
    be paid for answering wrong over not answering. The reward is 1 solved, else 0; the raw score is kept, and
    `verifier.reward: raw` pays it."""

    async def main() -> tuple[Any, Any]:
        ep = await start_page(load_miniwob("miniwob:find-greatest")[0], 60)
        try:
            page = await Page.open(ep.browser.cdp_url, ep.page_url)
            values = await page.read("[...document.querySelectorAll('.card')].map(c => Number(c.innerText))")
            wrong = min(range(len(values)), key=values.__getitem__)  # the smallest card: a wrong answer
            await page.click(f".card[data-index='{wrong}']")
            await page.click("#submit")
            await page.close()
            await asyncio.sleep(0.2)
            return await read_reward(ep), await read_reward(ep, raw=True)
        finally:
            await ep.stack.aclose()

    binary, raw = asyncio.run(main())
    assert (binary.reward, binary.success) == (0.0, False)
    assert binary.reward_info["raw_reward"] == pytest.approx(0.1)
    assert (raw.reward, raw.success) == (pytest.approx(0.1), False)
    assert MiniWoBVerifier(reward="raw").config.reward == "raw"
    with pytest.raises(ValueError, match="reward"):
        MiniWoBVerifier(reward="shaped")


def test_an_episode_regrades_from_the_inputs_its_page_received() -> None:
    """`verify` keeps the inputs the page received (its `patch`); `regrade` replays them on a fresh page of the same
    seed: each scripted solution (clicks, typing, checkboxes) scores 1 again, a wrong answer and doing nothing 0
    again, and the inputs of one seed replayed on a page of another seed do not solve it."""

    async def episode(task: Any, act: Any) -> tuple[float | None, str]:
        verifier = MiniWoBVerifier(run_id="hrl-test")
        async with await LocalBackend().create(SandboxSpec(workdir="/work"), "hrl-test", task.instance_id) as box:
            await verifier.prepare(box, task)
            ep = verifier._episodes[box.id]
            await act(ep.browser.cdp_url, ep.page_url)
            await asyncio.sleep(0.1)
            verdict = await verifier.verify(box, task)
        return verdict.reward, verdict.patch

    async def wrong(cdp_url: str, page_url: str) -> None:  # click-button: a button that is not the one asked for
        page = await Page.open(cdp_url, page_url)
        label = (await page.read("document.querySelector('#query').innerText")).split('"')[1]
        index = await page.read(f"[...document.querySelectorAll('#area button')].findIndex(b => b.innerText !== "
                                f"{label!r})")  # fmt: skip
        await page.click(f"#area button:nth-of-type({index + 1})")
        await page.close()

    async def nothing(cdp_url: str, page_url: str) -> None:
        return None

    async def main() -> list[tuple[str, float | None, float | None]]:
        verifier, rows = MiniWoBVerifier(run_id="hrl-test"), []
        cases = [(t, lambda u, p, n=t.miniwob: solve(n, u, p)) for t in load_tasks(f"miniwob:{SOLVED}")]
        cases += [(load_tasks("miniwob:click-button")[0], wrong), (load_tasks("miniwob:click-test")[0], nothing)]
        for task, act in cases:
            reward, recorded = await episode(task, act)
            again = await verifier.regrade(task, recorded)
            rows.append((task.miniwob, reward, again.reward))
        enter = load_tasks("miniwob:enter-text:2")  # seeds 0 and 1 ask for different words
        _, recorded = await episode(enter[0], lambda u, p: solve("enter-text", u, p))
        rows.append(("enter-text, another seed", 1.0, (await verifier.regrade(enter[1], recorded)).reward))
        return rows

    rows = asyncio.run(main())
    assert rows == [(name, 1.0, 1.0) for name in SOLVED.split(",")] + [
        ("click-button", 0.0, 0.0),
        ("click-test", 0.0, 0.0),
        ("enter-text, another seed", 1.0, 0.0),
    ]
