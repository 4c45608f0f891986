"""MiniWoB++ web tasks (`--tasks miniwob:NAME[,NAME…][:SEEDS]`, `miniwob:*`), graded from the page by the task's own
reward.

The tasks are the installed `miniwob` package's HTML files, as they are (`pip install 'hrl[browser]'`). Each task row
names one page and one seed (`miniwob:click-test,enter-text:3` = two pages × seeds 0, 1, 2; the episodes of a group
share their task's seed, so they face the same problem). Per episode the verifier (`MiniWoBVerifier`):

1. `prepare`: serves the package's pages on loopback, starts one headless Chromium (`hrl.runners.browser`), opens
   the task's page, seeds its random generator, gives the episode `time_limit_s` on the page's own clock and starts
   it; writes `browser.json` ({cdp_url, page_url}) into the sandbox's workdir for the agent's browser tools;
2. `verify`: reads the reward the page produced and the inputs it received (recorded from the start by hrl's own
   CDP session, `miniwob_replay`: the episode's final state, archived for `hrl regrade`, which replays them on a
   fresh page of the same seed), and stops the browser (its process group killed, its profile gone).

Reward: 1 when the page says the task is solved (its raw score is 1), else 0, from the page's `core.endEpisode` the
first time it ran for the episode; an episode the page never ended (no answer, or the agent's time ran out) scores
0. The page's raw score is kept in `reward_info` (`raw_reward`): MiniWoB scores -1..1, but not every page scores a
wrong answer below 0 (`find-greatest` ends one with +0.1), so paying it would pay a wrong answer over none.
`verifier.reward: raw` pays the raw score instead. A browser that cannot be started or reached is
`verifier_error`, never a 0.

Who sets the reward: the agent holds a CDP endpoint, which can run any script in the page, so the page's reward
globals (`WOB_REWARD_GLOBAL`, …) are not trusted. hrl's own CDP session records the console line `core.endEpisode`
writes, with its call stack, and accepts it only when every frame of that stack comes from the task's own files
(the page and its scripts): a call of `core.endEpisode` (or of a task function) from a script the agent evaluated has
a frame without a file and is refused (`reward_info["refused"]`). The globals are read too and kept in `reward_info`
(`page`); a disagreement is flagged (`tampered`). The agent's endpoint refuses live edits of the task's scripts
and request interception (`hrl.runners.browser.refusal`). Not covered: a main-world script that changes a global
the task grades against before a real click; see docs/browser.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.browser import (
    CDP,
    WHERE_HELP,
    Browser,
    BrowserError,
    BrowserWhere,
    EpisodeFolders,
    InSandbox,
    browser_episode,
    check_where,
    open_tab,
    provision_browser,
    sandbox_for,
    tell_agent,
    wait_until,
)
from hrl.runners.errors import PrerequisiteError
from hrl.runners.tasks.miniwob_replay import Recorder, inputs_json, record, replay
from hrl.runners.tasks.task import Task, TaskFormatError
from hrl.runners.tasks.taskcheck import TaskCheck
from hrl.runners.tasks.verifier import Verdict, Verifier
from hrl.sandboxes import Sandbox, SandboxBackend, SandboxError, SandboxSpec

__all__ = ["PREFIX", "MiniWoBTask", "MiniWoBVerifier", "MiniWoBVerifierConfig", "is_miniwob_spec", "load_miniwob",
           "miniwob_html", "start_page"]  # fmt: skip

PREFIX = "miniwob:"
STATEMENT = (
    "Complete the web task shown in the browser (its instruction is at the top of the page, in the element with "
    "id 'query'). The browser's DevTools (CDP) endpoint and the page's address are in the file browser.json in "
    'the working directory ({{"cdp_url": …, "page_url": …}}). Act on the page as a user would: click, type, '
    "select. Task: MiniWoB++ {name}."
)
_REWARD_LINE = re.compile(r"^reward: (-?[\d.e-]+) \(raw: (-?[\d.e-]+)\)$")


class MiniWoBTask(Task):
    """One MiniWoB++ page with one seed."""

    miniwob: str = Field(description="The page's name in the miniwob package (html/miniwob/<name>.html).")
    seed: int = Field(0, description="Seeds the page's Math.random before the episode's problem is generated.")


def miniwob_html() -> Path:
    """The installed miniwob package's html folder (found without importing the package, which loads gymnasium)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise PrerequisiteError("MiniWoB++ tasks need the miniwob package", hint="pip install 'hrl[browser]'")
    html = Path(next(iter(spec.submodule_search_locations))) / "html"
    if not (html / "core" / "core.js").is_file():
        raise PrerequisiteError(
            f"the miniwob package at {html.parent} has no html/core/core.js", hint="pip install -U miniwob"
        )
    return html


def is_miniwob_spec(source: str | Path) -> bool:
    return str(source).startswith(PREFIX)


def load_miniwob(spec: str) -> list[Task]:
    """Tasks for `miniwob:NAME[,NAME…][:SEEDS]` or `miniwob:*[:SEEDS]` (SEEDS: seeds 0..SEEDS-1, default 1)."""
    body = spec[len(PREFIX) :]
    names_part, _, seeds_part = body.partition(":")
    try:
        seeds = int(seeds_part) if seeds_part else 1
    except ValueError:
        seeds = 0
    if seeds < 1:
        raise TaskFormatError(
            f"{spec}: SEEDS must be a whole number ≥ 1 (got {seeds_part!r})",
            hint="e.g. miniwob:enter-text:8 for seeds 0 … 7",
        )
    pages = miniwob_html() / "miniwob"
    known = sorted(p.stem for p in pages.glob("*.html"))
    names = known if names_part.strip() == "*" else [n.strip() for n in names_part.split(",") if n.strip()]
    if not names:
        raise TaskFormatError(f"{spec}: no task named", hint="give miniwob:NAME[,NAME…][:SEEDS] or 'miniwob:*'")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TaskFormatError(f"{spec}: no MiniWoB++ task {', '.join(map(repr, unknown))} (the package has {len(known)}:"
                              f" {', '.join(known[:8])}, …; `hrl tasks ls 'miniwob:*'` lists them)",
                              hint="hrl tasks ls 'miniwob:*'")  # fmt: skip
    return [
        MiniWoBTask(
            instance_id=f"miniwob.{name}.s{seed}",
            repo="miniwob",
            problem_statement=STATEMENT.format(name=name),
            FAIL_TO_PASS=[],
            workdir="/work",
            miniwob=name,
            seed=seed,
        )
        for name in dict.fromkeys(names)
        for seed in range(seeds)
    ]


class MiniWoBVerifierConfig(BaseModel):
    """`verifier: {name: miniwob}`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")  # a misspelt setting is refused, not ignored

    time_limit_s: float = Field(
        3600.0, gt=0, description="The page's own episode clock (MiniWoB's default is 10 s, too short for a model)."
    )
    hide_paths: list[str] = Field(default_factory=list, description="Set by the CLI for every verifier; unused here.")
    agent_in_sandbox: bool = Field(
        False,
        description="The agent runs in the sandbox (a CLI, set by hrl): the browser's endpoint is forwarded into it "
        "as 127.0.0.1:cdp_port (its own unix socket, the sandbox's alone); else the agent is in hrl's process.",
    )
    cdp_port: int = Field(9222, gt=0, lt=65536, description="Where the sandbox sees the browser (agent_in_sandbox).")
    browser: BrowserWhere = Field("auto", description=WHERE_HELP)
    reward: Literal["binary", "raw"] = Field(
        "binary",
        description="binary: 1 for a solved page, 0 otherwise (the page's raw score kept in reward_info.raw_reward). "
        "raw: the page's own score, -1..1 (some pages score a wrong answer above 0: find-greatest +0.1).",
    )


@dataclass
class _Episode:
    stack: contextlib.AsyncExitStack
    browser: Browser
    cdp: CDP
    target: str  # hrl's session on the task's page
    page_url: str
    ends: list[dict[str, Any]] = field(default_factory=list)  # core.endEpisode lines, with their stacks
    recorder: Recorder | None = None  # the page's inputs, for `hrl regrade` (miniwob_replay)


def _as_miniwob(task: Task) -> MiniWoBTask:
    if isinstance(task, MiniWoBTask):
        return task
    return MiniWoBTask.model_validate(task.model_dump())


class MiniWoBVerifier(Verifier):
    name = "miniwob"

    def __init__(self, backend: SandboxBackend | None = None, config: MiniWoBVerifierConfig | None = None,
                 run_id: str = "", **options: Any) -> None:  # fmt: skip
        self.backend, self.run_id = backend, run_id
        self.config = config or MiniWoBVerifierConfig(**options)
        check_where(self.config.browser, backend)
        self._episodes: dict[str, _Episode] = {}
        self._folders = EpisodeFolders("hrl-cdp-")  # the episodes' socket folders (agent_in_sandbox)

    def needs_browser(self, task: Task) -> bool:
        """Every page is a browser task (its CLI is given a browser MCP server)."""
        return True

    async def provision(self, task: Task) -> None:
        miniwob_html()
        await provision_browser(self.config.browser, self.backend)

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        return SandboxSpec(workdir=task.workdir, env=dict(task.env))

    def episode_spec(self, task: Task) -> SandboxSpec:
        """One episode's sandbox: with `agent_in_sandbox`, the browser's endpoint forwarded into it from a unix socket
        in a folder made for this episode alone (another episode's sandbox cannot see it; `verify` or `release`
        removes it)."""
        spec = self.sandbox_spec(task)
        if not self.config.agent_in_sandbox:
            return spec
        folder = self._folders.make()
        return spec.model_copy(update={"forwards": {self.config.cdp_port: str(folder / "cdp.sock")}})

    async def prepare(self, sandbox: Sandbox, task: Task) -> None:
        """Start the episode's browser on the task's page; raises SandboxError when it cannot."""
        forwarded = sandbox.spec.forwards.get(self.config.cdp_port)
        if self.config.agent_in_sandbox and not forwarded:
            raise SandboxError(f"the sandbox of {task.instance_id} forwards no browser endpoint (port "
                               f"{self.config.cdp_port}): it was not made from this verifier's episode_spec")  # fmt: skip
        try:
            where = sandbox_for(self.config.browser, self.backend, self.run_id, task.instance_id)
            episode = await start_page(_as_miniwob(task), self.config.time_limit_s, forwarded or None, where)
        except BrowserError as e:
            raise SandboxError(f"the browser for {task.instance_id} did not start: {e}") from e
        self._episodes[sandbox.id] = episode
        await tell_agent(sandbox, episode.browser, episode.page_url, self.config.cdp_port if forwarded else None)

    async def verify(self, sandbox: Sandbox, task: Task) -> Verdict:
        episode = self._episodes.pop(sandbox.id, None)
        if episode is None:
            return Verdict.error(f"no browser was started for {task.instance_id} in sandbox {sandbox.id}")
        try:
            verdict = await read_reward(episode, raw=self.config.reward == "raw")
            if verdict.failure_reason is None:
                verdict.patch = await _inputs(episode, verdict.reward_info)
            return verdict
        finally:
            await episode.stack.aclose()
            self._forget(sandbox)

    async def grade(self, task: Task, patch: str) -> Verdict:
        return Verdict.error("a MiniWoB++ task is graded from its page, not from a diff", task=task.instance_id)

    async def regrade(self, task: Task, recorded: str) -> Verdict:
        """Grade an episode again from its recorded inputs (`verify`'s `patch`): replayed on a fresh page of the
        task and seed, whose reward is read as `verify` reads it (`miniwob_replay`)."""
        if not recorded:
            return Verdict.error("no inputs were recorded for this episode", task=task.instance_id)
        where = sandbox_for(self.config.browser, self.backend, self.run_id, task.instance_id)
        try:
            episode = await start_page(_as_miniwob(task), self.config.time_limit_s, None, where)
        except BrowserError as e:
            return Verdict.error(f"the browser for the replay did not start: {e}", task=task.instance_id)
        try:
            replayed = await replay(episode.cdp, episode.target, recorded, lambda: bool(episode.ends))
            for _ in range(20):  # a page may end its episode a moment after the last input
                if episode.ends:
                    break
                await asyncio.sleep(0.05)
            verdict = await read_reward(episode, raw=self.config.reward == "raw")
            verdict.reward_info["replayed_inputs"] = replayed
            return verdict
        except (BrowserError, ValueError) as e:
            return Verdict.error(f"the recorded inputs could not be replayed: {e}", task=task.instance_id)
        finally:
            await episode.stack.aclose()

    async def release(self, sandbox: Sandbox) -> None:
        """Stop the browser of `sandbox`'s episode if `verify` did not (the agent failed, the episode was cancelled)."""
        if (episode := self._episodes.pop(sandbox.id, None)) is not None:
            await episode.stack.aclose()
        self._forget(sandbox)

    def _forget(self, sandbox: Sandbox) -> None:
        """Remove the episode's socket folder (agent_in_sandbox), its browser stopped."""
        self._folders.forget(sandbox.spec.forwards.get(self.config.cdp_port))

    async def close(self) -> None:
        """Stop every browser an episode left open (an episode that failed before `verify`)."""
        while self._episodes:
            await self._episodes.popitem()[1].stack.aclose()
        self._folders.close()


async def start_page(task: MiniWoBTask, time_limit_s: float, unix_socket: str | None = None,
                     sandbox: InSandbox | None = None) -> _Episode:  # fmt: skip
    """Start a browser on the task's page, seeded, with the episode running; raises BrowserError. `unix_socket`: the
    agent's relay listens there too (a sandbox's forwarded endpoint); `sandbox`: the browser runs in one."""
    stack = contextlib.AsyncExitStack()
    try:
        opened = browser_episode(miniwob_html(), unix_socket=unix_socket, sandbox=sandbox)
        browser, cdp = await stack.enter_async_context(opened)
        page_url = f"{browser.site}/miniwob/{task.miniwob}.html"
        episode = _Episode(stack, browser, cdp, await open_tab(cdp), page_url)
        cdp.on("Runtime.consoleAPICalled", lambda p, s: _on_console(episode, p, s))
        await cdp.call("Runtime.enable", episode.target)
        await cdp.call("Page.enable", episode.target)
        await cdp.call("Page.navigate", episode.target, url=page_url)
        ready_js = "document.readyState === 'complete' && typeof core === 'object'"
        await wait_until(cdp, episode.target, ready_js, "the task's page")
        script = (f"core.EPISODE_MAX_TIME = {int(time_limit_s * 1000)}; Math.seedrandom({json.dumps(str(task.seed))}); "
                  "core.startEpisodeReal(); WOB_TASK_READY")  # fmt: skip
        ready = await _evaluate(cdp, episode.target, script)
        if ready is not True:
            raise BrowserError(f"the page {page_url} did not become ready (WOB_TASK_READY = {ready!r})")
        episode.recorder = await record(cdp, episode.target)
        return episode
    except BaseException:
        await stack.aclose()
        raise


async def _evaluate(cdp: CDP, target: str, expression: str) -> Any:
    """Run `expression` in the page's main world (reads only: what hrl trusts comes from `_on_console`)."""
    reply = await cdp.call("Runtime.evaluate", target, expression=expression, returnByValue=True)
    if "exceptionDetails" in reply:
        raise BrowserError(f"the page raised: {reply['exceptionDetails'].get('text')} ({expression[:80]})")
    return reply.get("result", {}).get("value")


def _on_console(episode: _Episode, params: dict[str, Any], session: str | None) -> None:
    if session != episode.target or params.get("type") != "log":
        return
    args = params.get("args", [])
    text = args[0].get("value") if args else None
    if not isinstance(text, str) or not (m := _REWARD_LINE.match(text)):
        return
    frames = params.get("stackTrace", {}).get("callFrames", [])
    own = episode.browser.site + "/"
    episode.ends.append({
        "reward": float(m.group(1)), "raw": float(m.group(2)),
        "top": frames[0].get("functionName", "") if frames else "",
        "top_url": frames[0].get("url", "") if frames else "",
        "foreign": [f"{f.get('functionName') or '(anonymous)'}@{f.get('url') or '(no file)'}"
                    for f in frames if not f.get("url", "").startswith(own)],
    })  # fmt: skip


async def _inputs(episode: _Episode, info: dict[str, Any]) -> str:
    """The inputs the page received, as the verdict's `patch` (archived for `hrl regrade`); "" with
    `info["inputs_error"]` when they cannot be read (the episode is then not regradable, its reward stands)."""
    try:
        if episode.recorder is None:
            raise BrowserError("no recorder was started")
        return inputs_json(await episode.recorder.inputs())
    except BrowserError as e:
        info["inputs_error"] = str(e)[:300]
        return ""


async def read_reward(episode: _Episode, raw: bool = False) -> Verdict:
    """The episode's verdict from the first accepted `core.endEpisode` of the page (see the module's docstring):
    1 solved, else 0; `raw`: the page's own score."""
    try:
        page = await _evaluate(episode.cdp, episode.target, "({done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, "
                               "raw: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON, url: location.href})")  # fmt: skip
    except BrowserError as e:
        return Verdict.error(f"the browser could not be read at the end of the episode: {e}")
    info: dict[str, Any] = {"page": page, "blocked_requests": episode.browser.blocked[:20],
                            "refused_commands": episode.browser.refused[:20]}  # fmt: skip
    refused = [e for e in episode.ends if e["foreign"] or not e["top_url"].endswith("/core/core.js")]
    accepted = [e for e in episode.ends if e not in refused]
    if refused:
        info["refused"] = refused[:5]
    if not accepted:
        info["ended"] = False
        info["tampered"] = bool(refused) or bool(page and page.get("done"))
        return Verdict(0.0, info, success=False)
    first = accepted[0]
    info.update(ended=True, raw_reward=first["raw"], time_scaled_reward=first["reward"])
    info["tampered"] = bool(refused) or (len(accepted) > 1 and page is not None and page.get("raw") != first["raw"])
    solved = first["raw"] >= 1.0
    return Verdict(first["raw"] if raw else float(solved), info, success=solved)


async def check_miniwob_task(task: Task, time_limit_s: float = 60.0) -> TaskCheck:
    """`hrl tasks validate` for a MiniWoB++ page: its scripted solution (`miniwob_solutions`) scores 1 and an
    episode nobody acts in scores 0, each in a browser of its own. A page with no scripted solution is not valid
    (only its no-op is graded)."""
    from hrl.runners.tasks.miniwob_solutions import SOLUTIONS, solve

    started = time.monotonic()
    page = _as_miniwob(task)

    async def run(act: bool) -> Verdict:
        try:
            episode = await start_page(page, time_limit_s)
        except BrowserError as e:
            return Verdict.error(f"the browser did not start: {e}")
        try:
            if act:
                await solve(page.miniwob, episode.browser.cdp_url, episode.page_url)
            return await read_reward(episode)
        except BrowserError as e:
            return Verdict.error(f"the scripted solution failed: {e}")
        finally:
            await episode.stack.aclose()

    problems: list[str] = []
    gold = await run(True) if page.miniwob in SOLUTIONS else None
    empty = await run(False)
    if gold is None:
        problems.append("no scripted solution (only the no-op was graded)")
    elif gold.reward != 1.0:
        problems.append(
            f"solution: reward {gold.reward} {gold.failure_reason or ''} {gold.reward_info.get('error', '')}".strip()
        )
    if empty.reward != 0.0:
        problems.append(
            f"no-op: reward {empty.reward} {empty.failure_reason or ''} {empty.reward_info.get('error', '')}".strip()
        )
    return TaskCheck(task.instance_id, not problems, problems, gold, empty, time.monotonic() - started)
