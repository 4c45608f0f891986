"""`HarborVerifier`: grades a Harbor task by running its tests/test.sh in a fresh container after the agent.

Per episode:

1. `provision(task)`: the task's image, built from environment/ once per content hash (`harbor.build_image`).
2. The agent works in a container of that image, at its WORKDIR. Nothing of tests/ or solution/ is ever there.
3. `verify(sandbox, task)`: the agent's state carries over into a **fresh** grading container (`carry`):
   `container` (default, as Harbor grades): the agent's container is committed as an image and the tests run in a
   container of it, so every change the agent made (installed packages, files outside the workdir) is graded, but
   none of its processes survive; `workdir`: only the workdir is copied into a container of the clean image, so
   the system the tests run on is the task's own, untouched by the agent. Before test.sh runs, /tests and
   /logs/verifier are emptied (a reward file the agent planted is gone), tests/ is copied to /tests, and
   `bash /tests/test.sh` runs at the workdir with [verifier] env, under [verifier] timeout_sec, with no network
   unless `network: host`.
4. The reward is /logs/verifier/reward.txt (a number), else reward.json (`{"reward": x}`, or one number).
   Success (the trace's `success`) is a reward of 1, for a reward of 0 or 1 (Harbor's tests pass or fail); a
   fractional reward says nothing of it (null), unless reward.json says `"success": true|false` beside it.

A task with `[browser]` (a web app the agent uses through a browser) gets per episode, in `prepare`: its app started
in the agent's container, reached from the host through the container's tunnel (`SandboxSpec.exposes`), and one
headless Chromium (in a container of its own unless `browser: host`) on the app's page, whose DevTools endpoint the container sees as 127.0.0.1:cdp_port
(`SandboxSpec.forwards`) and whose requests reach only the app; `browser.json` ({cdp_url, page_url}) in the workdir
says where. The browser stops before the tests run, and the tests grade as for any Harbor task.

A test.sh past its limit scores 0 with the reason in `reward_info["timeout"]` (the agent's state hangs the tests:
its episode), and so does one that exits non-zero without a reward file (`reward_info["failed"]`: `set -e` tests
that stop at the first failure). A test.sh that exits 0 with no reward file, a reward that is no number, or an
environment that cannot be built are grading failures: `verifier_error` (never trained on), with the log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import tarfile
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.browser import (
    WHERE_HELP,
    Browser,
    BrowserError,
    BrowserWhere,
    EpisodeFolders,
    browser_episode,
    open_tab,
    provision_browser,
    sandbox_for,
    tell_agent,
    tunnel_endpoint,
    wait_until,
)
from hrl.runners.errors import UsageError
from hrl.runners.tasks.harbor import HarborBrowser, HarborTask, build_image, image_tag
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.taskcheck import TaskCheck
from hrl.runners.tasks.verifier import Verdict, Verifier
from hrl.runners.trace import binary_success
from hrl.sandboxes import Sandbox, SandboxBackend, SandboxError, SandboxSpec

__all__ = ["HarborVerifier", "HarborVerifierConfig", "as_harbor", "browser_of"]

REWARD_DIR = "/logs/verifier"
# As root: no reward file may outlive the agent, and the tests' user may write the new one.
CLEAN = f"rm -rf /tests {REWARD_DIR} && mkdir -p /tests {REWARD_DIR} /logs/agent && chmod 777 /logs {REWARD_DIR}"
REWARD_FILES = ("reward.txt", "reward.json")
FINAL_REPO = "hrl/harbor-final"  # the kept final images, one tag per episode (`hrl regrade`)
FINAL_LABEL = "hrl.final"  # on each, with hrl.run: `hrl sandbox prune --run RUN --final-images` removes them
REWARD_BYTES = 65536  # a reward file is a number or a small JSON object: what lies past this is no reward
APP_LOG = "/tmp/hrl-app.log"  # [browser] start's output, in the agent's container


class HarborVerifierConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    carry: Literal["container", "workdir"] = Field(
        "container",
        description="What of the agent's container the tests see: container = its whole filesystem (committed as "
        "an image; Harbor's semantics); workdir = only its workdir, in a container of the clean image.",
    )
    network: Literal["none", "host"] = Field(
        "none", description="Network of the grading (and solution) containers: none, or host for a test.sh that "
        "downloads (many Terminal-Bench 2 tests install uv or pytest at test time)."
    )  # fmt: skip
    timeout_s: float = Field(
        0.0, ge=0, description="Limit for test.sh in seconds; 0 = the task's [verifier] timeout_sec."
    )
    setup_timeout_s: float = Field(
        300.0, gt=0, description="Limit for each setup step (copies, workdir carry-over), s."
    )
    solve_timeout_s: float = Field(
        0.0, ge=0, description="Limit for solution/solve.sh; 0 = [agent] timeout_sec or 600."
    )
    keep_final: bool = Field(
        True,
        description="Keep each episode's final state as an image (tagged hrl/harbor-final:<id>, labelled "
        "hrl.final=1; carry: container = the agent's committed container, workdir = the clean image with its "
        "workdir), named in reward_info['final_image'], so `hrl regrade` can grade it again.",
    )
    log_chars: int = Field(3000, ge=0, description="How much of test.sh's output tail goes into reward_info['log'].")
    hide_paths: list[str] = Field(default_factory=list, description="Host paths no sandbox may see (docker: none).")
    run_id: str = Field("hrl-grade", description="Label of grading sandboxes (hrl.run), for `hrl sandbox prune`.")
    cdp_port: int = Field(
        9222, gt=0, lt=65536, description="Where the agent's container sees the browser of a [browser] task."
    )
    browser: BrowserWhere = Field("auto", description=WHERE_HELP)


def as_harbor(task: Task) -> HarborTask:
    """The task as a HarborTask (a task that went through a dict keeps its extra fields)."""
    if isinstance(task, HarborTask):
        return task
    if "task_dir" not in (task.model_extra or {}):
        raise UsageError(
            f"task {task.instance_id} is no Harbor task (it has no task_dir)",
            hint="the harbor verifier grades task folders: give --tasks DIR, or set -c verifier.name=tests",
        )
    return HarborTask.model_validate(task.model_dump())


def browser_of(task: Task) -> HarborBrowser | None:
    """A Harbor task's `[browser]` (None for a task without one, or no Harbor task)."""
    if isinstance(task, HarborTask):
        return task.browser
    found = (task.model_extra or {}).get("browser")
    return HarborBrowser.model_validate(found) if found else None


class HarborVerifier(Verifier):
    """Builds Harbor tasks' images, and grades the agent's final state with the task's tests/test.sh."""

    name = "harbor"

    def __init__(self, backend: SandboxBackend, config: HarborVerifierConfig | None = None, **options: Any) -> None:
        if backend.name != "docker":
            raise UsageError(
                "Harbor tasks run in Docker sandboxes (their environment is a Dockerfile)", hint="use --sandbox docker"
            )
        self.backend = backend
        self.config = config or HarborVerifierConfig(**options)
        self._images: dict[str, tuple[str, str]] = {}  # instance id -> (image, workdir)
        self._locks: dict[str, asyncio.Lock] = {}
        self._browsers: dict[str, tuple[contextlib.AsyncExitStack, Browser]] = {}  # sandbox id -> its episode's
        self._folders = EpisodeFolders("hrl-web-")  # the [browser] episodes' socket folders

    @property
    def grades_container(self) -> bool:  # type: ignore[override]
        """carry: container (the agent's container committed and graded whole)."""
        return self.config.carry == "container"

    def needs_browser(self, task: Task) -> bool:
        """The task serves a web app the agent uses through a browser (its CLI is given a browser MCP server)."""
        return browser_of(task) is not None

    async def provision(self, task: Task) -> None:
        h = as_harbor(task)
        async with self._locks.setdefault(h.instance_id, asyncio.Lock()):
            if h.instance_id not in self._images:
                self._images[h.instance_id] = await asyncio.to_thread(build_image, h)
        if h.browser is not None:
            await provision_browser(self.config.browser, self.backend)

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        h = as_harbor(task)
        image, workdir = self._images.get(h.instance_id) or (image_tag(h), "/app")
        return SandboxSpec(
            image=image, workdir=workdir, network="none", cpus=h.cpus, memory_mb=h.memory_mb,
            labels={"hrl.task": h.instance_id[:60]}, hidden_paths=list(self.config.hide_paths),
        )  # fmt: skip

    def episode_spec(self, task: Task) -> SandboxSpec:
        """One episode's sandbox. A [browser] task's gets, in a folder made for this episode alone, the browser's
        endpoint forwarded in (cdp_port) and its app's port exposed to hrl (`verify` or `release` removes it)."""
        spec, browser = self.sandbox_spec(task), browser_of(task)
        if browser is None:
            return spec
        folder = self._folders.make()
        return spec.model_copy(update={"forwards": {self.config.cdp_port: str(folder / "cdp.sock")},
                                       "exposes": {browser.port: str(folder / "app.sock")}})  # fmt: skip

    async def prepare(self, sandbox: Sandbox, task: Task) -> None:
        """The image is the task's starting state. A [browser] task's app is started in the container, and the
        episode's browser on its page; raises SandboxError when either does not come up (never the agent's 0)."""
        browser = browser_of(task)
        if browser is None:
            return
        cdp_socket = sandbox.spec.forwards.get(self.config.cdp_port)
        app_socket = sandbox.spec.exposes.get(browser.port)
        if not (cdp_socket and app_socket):
            raise SandboxError(f"the sandbox of {task.instance_id} has no browser endpoint or app tunnel: it was not "
                               "made from this verifier's episode_spec (rollout.warm_sandboxes and rollout.reuse do "
                               "not apply to [browser] tasks)")  # fmt: skip
        started = await sandbox.exec(["sh", "-c", f"({browser.start}) > {APP_LOG} 2>&1 < /dev/null &"], timeout_s=30)
        if started.exit_code != 0:
            raise SandboxError(f"[browser] start of {task.instance_id} failed: {started.stderr.strip()[-500:]}")
        stack = contextlib.AsyncExitStack()
        try:
            origin = await stack.enter_async_context(tunnel_endpoint(app_socket))
            await _wait_app(sandbox, origin + browser.path, browser.ready_timeout_sec)
            where = sandbox_for(
                self.config.browser, self.backend, self.config.run_id, task.instance_id, site_port=browser.port
            )  # the browser's page is at the app's own port
            opened, cdp = await stack.enter_async_context(
                browser_episode(origin, unix_socket=cdp_socket, sandbox=where)
            )
            page_url = opened.site + browser.path  # as the browser sees the app
            tab = await open_tab(cdp)
            await cdp.call("Page.enable", tab)
            await cdp.call("Page.navigate", tab, url=page_url)
            loaded = f"document.readyState === 'complete' && location.href.startsWith({json.dumps(page_url)})"
            await wait_until(cdp, tab, loaded, f"the app's page {page_url}")  # the agent's first look sees it
        except BaseException as exc:
            await stack.aclose()
            if isinstance(exc, BrowserError | OSError):
                raise SandboxError(f"the browser for {task.instance_id} did not start: {exc}") from exc
            raise
        self._browsers[sandbox.id] = (stack, opened)
        await tell_agent(sandbox, opened, page_url, self.config.cdp_port)

    async def release(self, sandbox: Sandbox) -> None:
        """Stop the browser of `sandbox`'s episode if `verify` did not (the agent failed, the episode was cancelled),
        and remove its socket folder."""
        if (held := self._browsers.pop(sandbox.id, None)) is not None:
            await held[0].aclose()
        self._folders.forget(sandbox.spec.forwards.get(self.config.cdp_port))

    async def close(self) -> None:
        """Stop every browser an episode left open, and remove the socket folders."""
        while self._browsers:
            await self._browsers.popitem()[1][0].aclose()
        self._folders.close()

    async def verify(self, sandbox: Sandbox, task: Task, keep: bool = True) -> Verdict:
        h, cfg, started = as_harbor(task), self.config, time.monotonic()
        committed: str | None = None
        seen: dict[str, Any] = {}
        if (held := self._browsers.pop(sandbox.id, None)) is not None:  # the browser stops before the tests run
            await held[0].aclose()
            seen = {"blocked_requests": held[1].blocked[:50], "refused_commands": held[1].refused[:50]}
        try:
            if cfg.carry == "container":
                labels = {"hrl.task": h.instance_id[:60], "hrl.run": cfg.run_id, FINAL_LABEL: "1"}
                committed = await sandbox.commit(labels)  # a docker sandbox's: Harbor tasks run in no other
                verdict = await self._test(h, committed, None)
                if cfg.keep_final and keep:  # the snapshot `hrl regrade` grades again
                    verdict.reward_info["final_image"] = await self._keep(committed)
                    committed = None
            else:
                workdir = await self._pack_workdir(sandbox)
                verdict = await self._test(h, self.sandbox_spec(h).image, workdir, keep=cfg.keep_final and keep)
        except (SandboxError, OSError) as exc:
            verdict = Verdict.error(f"grading sandbox failed: {exc}")
        finally:
            if committed is not None:
                await _quietly(self.backend, committed)
        verdict.reward_info["grading_s"] = round(time.monotonic() - started, 3)
        if held is not None:
            verdict.reward_info["browser"] = seen
        return verdict

    async def _keep(self, image: str) -> str:
        """Tag a committed image `hrl/harbor-final:<its id>`, so it outlives the episode; the tag."""
        api = await self.backend.connect()  # type: ignore[attr-defined]
        tag = image.removeprefix("sha256:")[:32]
        await self.backend.call(api.tag, image, FINAL_REPO, tag)  # type: ignore[attr-defined]
        return f"{FINAL_REPO}:{tag}"

    async def regrade(self, task: Task, image: str) -> Verdict:
        """The task's tests again on an episode's kept final image (`final_image`); a missing image raises
        FileNotFoundError (the snapshot was removed: nothing to regrade)."""
        import docker

        h, started = as_harbor(task), time.monotonic()
        api = await self.backend.connect()  # type: ignore[attr-defined]
        try:
            await self.backend.call(api.inspect_image, image)  # type: ignore[attr-defined]
        except docker.errors.ImageNotFound as exc:
            raise FileNotFoundError(f"its final image {image} was removed") from exc
        await self.provision(h)
        try:
            verdict = await self._test(h, image, None)
        except (SandboxError, OSError) as exc:
            verdict = Verdict.error(f"grading sandbox failed: {exc}")
        verdict.reward_info["grading_s"] = round(time.monotonic() - started, 3)
        return verdict

    async def grade(self, task: Task, patch: str) -> Verdict:
        """The task's tests on its untouched image (Harbor tasks carry state, not diffs: `patch` must be empty)."""
        if patch.strip():
            return Verdict.error("a Harbor task is graded from a sandbox's state, not from a diff")
        h, started = as_harbor(task), time.monotonic()
        await self.provision(h)
        try:
            verdict = await self._test(h, self.sandbox_spec(h).image, None)
        except (SandboxError, OSError) as exc:
            verdict = Verdict.error(f"grading sandbox failed: {exc}")
        verdict.reward_info["grading_s"] = round(time.monotonic() - started, 3)
        return verdict

    async def solve(self, task: Task) -> Verdict:
        """The gold: solution/solve.sh run in a container of the task's image, then graded as an agent would be."""
        h = as_harbor(task)
        if not (h.folder / "solution" / "solve.sh").is_file():
            return Verdict.error(f"{h.folder} has no solution/solve.sh")
        await self.provision(h)
        cfg = self.config
        limit = cfg.solve_timeout_s or h.agent_timeout_s or 600.0
        spec = self.sandbox_spec(h).model_copy(update={"network": cfg.network})
        try:
            async with await self.backend.create(spec, cfg.run_id, _episode("solve", h)) as sandbox:
                await _root(sandbox, "rm -rf /solution && mkdir -p /solution", cfg.setup_timeout_s)
                await sandbox.copy_in(str(h.folder / "solution"), "/solution")
                run = await sandbox.exec(["bash", "/solution/solve.sh"], timeout_s=limit)
                await _root(sandbox, "rm -rf /solution", cfg.setup_timeout_s)
                verdict = await self.verify(sandbox, h, keep=False)  # a gold run: no episode to regrade
        except (SandboxError, OSError) as exc:
            return Verdict.error(f"solution sandbox failed: {exc}")
        verdict.reward_info["solve"] = {"exit_code": run.exit_code, "timed_out": run.timed_out, "s": run.duration_s}
        return verdict

    # ---- grading --------------------------------------------------------------------------------------------
    async def _test(self, task: HarborTask, image: str, workdir_tar: bytes | None, keep: bool = False) -> Verdict:
        """test.sh in a fresh container of `image` (with `workdir_tar` laid out at the workdir); `keep`: the grading
        container, workdir laid out and before any test ran, kept as the episode's final image (carry: workdir)."""
        kept: list[str] = []
        verdict = await self._run_tests(task, image, workdir_tar, kept if keep else None)
        if kept:
            verdict.reward_info["final_image"] = kept[0]
        return verdict

    async def _run_tests(
        self, task: HarborTask, image: str, workdir_tar: bytes | None, kept: list[str] | None
    ) -> Verdict:
        cfg = self.config
        spec = self.sandbox_spec(task).model_copy(update={"image": image, "network": cfg.network})
        async with await self.backend.create(spec, cfg.run_id, _episode("grade", task)) as sandbox:
            await _root(sandbox, CLEAN, cfg.setup_timeout_s)
            await sandbox.copy_in(str(task.folder / "tests"), "/tests")
            if workdir_tar is not None:
                await self._unpack_workdir(sandbox, workdir_tar)
                if kept is not None:  # the clean image with the agent's workdir, as graded, kept for regrading
                    labels = {"hrl.task": task.instance_id[:60], "hrl.run": cfg.run_id, FINAL_LABEL: "1"}
                    kept.append(await self._keep(await sandbox.commit(labels)))
            limit = cfg.timeout_s or task.verifier_timeout_s
            run = await sandbox.exec(["bash", "/tests/test.sh"], timeout_s=limit, env=dict(task.verifier_env))
            log = _tail(run.stdout + ("\n" + run.stderr if run.stderr.strip() else ""), cfg.log_chars)
            if run.timed_out:  # the agent's state hangs the tests: its episode, scored 0
                return Verdict.failed({"timeout": f"tests/test.sh ran past {limit:g} s", "log": log})
            found = await _read_reward(sandbox)
        info = {"exit_code": run.exit_code, "log": log}
        if found is None and run.exit_code != 0:  # the tests failed on the agent's state before scoring it
            return Verdict.failed({**info, "failed": f"tests/test.sh exited {run.exit_code} and wrote no reward"})
        if found is None:  # it passed and said nothing: the test script itself is broken
            return Verdict.error(f"tests/test.sh exited 0 but wrote no {REWARD_DIR}/reward.txt or reward.json", log=log)
        name, data = found
        return _reward(name, data[:REWARD_BYTES].decode("utf-8", "replace"), info)

    async def _pack_workdir(self, sandbox: Sandbox) -> bytes:
        path = f"/tmp/hrl-workdir-{uuid.uuid4().hex[:8]}.tar"
        await _root(sandbox, f"tar -C {sandbox.workdir} -cf {path} .", self.config.setup_timeout_s)
        data = await sandbox.read_file(path)
        await _root(sandbox, f"rm -f {path}", self.config.setup_timeout_s)
        return data

    async def _unpack_workdir(self, sandbox: Sandbox, data: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # refuse what could land outside the workdir
            for member in tar:
                if member.name.startswith("/") or ".." in member.name.split("/") or member.isdev():
                    raise SandboxError(f"the agent's workdir holds an unsafe entry {member.name!r}")
        path = "/tmp/hrl-workdir.tar"
        await sandbox.write_file(path, data)
        wd = sandbox.workdir
        script = f"find {wd} -mindepth 1 -delete && tar -C {wd} -xpf {path} --no-overwrite-dir && rm -f {path}"
        await _root(sandbox, script, self.config.setup_timeout_s)


async def _wait_app(sandbox: Sandbox, url: str, timeout_s: float) -> None:
    """Until the app answers `url` with any HTTP status (through the tunnel); SandboxError with the app's log past
    `timeout_s`."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url, allow_redirects=False) as response:
                    await response.read()
                    return
            if time.monotonic() > deadline:
                log = await sandbox.exec(["sh", "-c", f"tail -c 1500 {APP_LOG}"], timeout_s=30)
                raise SandboxError(f"the app did not answer {url} within {timeout_s:g} s; its log: "
                                   f"{log.stdout.strip() or '(empty)'}")  # fmt: skip
            await asyncio.sleep(0.2)


async def _read_reward(sandbox: Sandbox) -> tuple[str, bytes] | None:
    """The first reward file test.sh wrote, and its bytes. Read through the sandbox's file API, not an exec's
    output: a loaded Docker daemon can close an exec's stream before the last of its output, and a reward read
    that way came back empty."""
    for name in REWARD_FILES:
        try:
            return name, await sandbox.read_file(f"{REWARD_DIR}/{name}")
        except (FileNotFoundError, IsADirectoryError):
            continue
    return None


def _reward(name: str, text: str, info: dict[str, Any]) -> Verdict:
    """The reward of reward.txt (a number) or reward.json ({"reward": x}, or one number; all kept in rewards)."""
    try:
        if name == "reward.txt":
            value: Any = float(text.strip())
        else:
            data = json.loads(text)
            numbers = {k: v for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}
            info["rewards"] = numbers
            value = numbers.get("reward", next(iter(numbers.values())) if len(numbers) == 1 else None)
            if value is None:
                raise ValueError(f"no 'reward' key among {sorted(numbers) or 'no numbers'}")
    except ValueError as exc:
        return Verdict.error(f"{REWARD_DIR}/{name} holds no reward: {exc}", **info)
    if not math.isfinite(float(value)):
        return Verdict.error(f"{REWARD_DIR}/{name} holds {value}, not a finite reward", **info)
    info = {**info, "reward_file": name}
    return Verdict(float(value), info, success=binary_success(float(value), info.get("rewards")))


async def _root(sandbox: Sandbox, script: str, timeout_s: float) -> None:
    run = await sandbox.exec(["bash", "-c", script], timeout_s=timeout_s, user="0")  # type: ignore[call-arg]
    if run.exit_code != 0:
        raise SandboxError(
            f"setup step failed (exit {run.exit_code}): {script[:80]}: {(run.stderr or run.stdout)[-500:]}"
        )


async def _quietly(backend: SandboxBackend, image: str) -> None:
    with contextlib.suppress(SandboxError):  # a leftover image costs disk, not correctness
        await backend.remove_image(image)


def _episode(kind: str, task: HarborTask) -> str:
    return f"{kind}-{task.instance_id[:40]}-{uuid.uuid4().hex[:8]}"


def _tail(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else "…" + text[-n:]


async def check_harbor_task(verifier: HarborVerifier, task: Task) -> TaskCheck:
    """`hrl tasks validate` for a Harbor task: solution/solve.sh scores 1, the untouched environment scores 0."""
    started, problems = time.monotonic(), []
    try:
        await verifier.provision(task)
    except SandboxError as exc:
        return TaskCheck(task.instance_id, False, [f"environment: {exc}"], seconds=time.monotonic() - started)
    gold, empty = await asyncio.gather(verifier.solve(task), verifier.grade(task, ""))
    for what, verdict, want in (("solution/solve.sh", gold, 1.0), ("no change", empty, 0.0)):
        if verdict.failure_reason:
            problems.append(f"{what}: {verdict.failure_reason}: {verdict.reward_info.get('error')}")
        elif verdict.reward != want:
            info = verdict.reward_info
            why = (
                info.get("timeout") or info.get("failed") or (info.get("log") or "").strip()[-200:].replace("\n", " | ")
            )
            problems.append(f"{what}: reward {verdict.reward:g}, expected {want:g}" + (f" ({why})" if why else ""))
    return TaskCheck(task.instance_id, not problems, problems, gold, empty, time.monotonic() - started)
