"""`hrl.session()`: a Python agent's handle on one proxy session, sugar over the session HTTP API.

    async with hrl.session(task=task, url="http://127.0.0.1:8765", control_token=TOKEN) as s:
        client = s.openai()                      # an AsyncOpenAI bound to the session (base URL /s/<token>/v1)
        ...                                      # or any framework given s.base_url, s.api_key, s.model
        async with s.child("critic", trainable=False) as critic:
            ...                                  # a sub-agent: its own token, its calls a child in the same trace
        s.reward(1.0, {"why": "correct"})        # sent with the session's end

The data plane is the one every CLI agent uses (`/s/<token>/v1/...`, API key `hrl-<token>`); registering and ending
go through the control routes (`POST /sessions`, `POST /s/<token>/end`), which need the control token
(`hrl serve --control-token-file F`). `session()` keeps that token to itself: the session object holds only the
agent key the registration answered with, which opens and retires sub-agents of this one session tree
(`POST /s/<token>/children`, `/retire`) and nothing else. `current_session()` finds the innermost session (or
child) through a contextvar, for code deep inside a framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from hrl.runners.errors import HrlError

__all__ = ["NoSessionError", "SessionAPIError", "WhiteboxSession", "current_session", "session"]

_CURRENT: contextvars.ContextVar[WhiteboxSession | None] = contextvars.ContextVar("hrl_session", default=None)
_TIMEOUT_S = 30.0  # one control request


class NoSessionError(HrlError):
    """`current_session()` outside any `hrl.session(...)` / `child(...)` block."""


class SessionAPIError(HrlError):
    """The proxy refused a session request (wrong control token or agent key, unknown session)."""


def current_session() -> WhiteboxSession:
    """The innermost open session (a child inside `async with s.child(...)`). Raises NoSessionError."""
    s = _CURRENT.get()
    if s is None:
        raise NoSessionError(
            "no hrl session is open here", hint="call it inside `async with hrl.session(...)`, or in a white-box agent"
        )
    return s


_CONTROL_HINT = "pass the control token `hrl serve --control-token-file F` wrote (control_token=…)"
_AGENT_HINT = "sub-agents open under a live session of this tree, with the agent key it was registered with"


async def _control(url: str, bearer: str, path: str, body: dict[str, Any], hint: str = _CONTROL_HINT) -> dict[str, Any]:
    """POST `body` to `path` with `bearer` (the control token, or an agent key on the agent routes)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {bearer}"}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S)) as http,
        http.post(url + path, json=body, headers=headers) as resp,
    ):
        data = await resp.json(content_type=None)
        if resp.status >= 400:
            message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            raise SessionAPIError(
                f"POST {path} on the proxy at {url} answered {resp.status}: {message or data}",
                hint=hint,
            )
        return dict(data)


class WhiteboxSession:
    """One registered session (or sub-agent) of a proxy; see the module docstring. `agent_key`: the tree's scoped
    credential (it opens sub-agents); never the control token."""

    def __init__(
        self,
        url: str,
        token: str,
        model: str,
        agent_key: str | None,
        *,
        task: Any = None,
        name: str | None = None,
        trainable: bool = True,
    ) -> None:
        self.url, self.token, self.model, self.task = url.rstrip("/"), token, model, task
        self.agent_key, self.name, self.trainable = agent_key, name, trainable
        self.reward_value: float | None = None
        self.reward_info: dict[str, Any] = {}
        self.result: dict[str, Any] = {}  # what the proxy answered the end with (trace_id, calls, status)
        # a browser task's browser, where the episode has one: {"cdp_url": the DevTools endpoint (hrl's relay) as
        # this process reaches it, "page_url": the task's page}
        self.browser: dict[str, str] | None = None
        self.sandbox: Any = None  # the episode's sandbox, where its verifier grades one (its tools run there)
        self.options: dict[str, Any] = {}  # in a rollout: rollout.agent_options, the agent's own knobs
        self._client_key: str | None = None  # an online run's client key (session(key=…)): for send_reward
        self._clients: list[Any] = []

    @property
    def root_url(self) -> str:
        """`http://HOST:PORT/s/<token>`: the base for SDKs that append `/v1/...` themselves (Anthropic, Gemini)."""
        return f"{self.url}/s/{self.token}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`…/s/<token>/v1`): Chat Completions and Responses live under it."""
        return self.root_url + "/v1"

    @property
    def api_key(self) -> str:
        return f"hrl-{self.token}"

    def env(self, url: str | None = None) -> dict[str, str]:
        """Environment variables pointing an OpenAI-compatible program (and `hrl.current_session()`) at this session;
        `url`: where that program reaches the proxy, when not where this process does (a relay in a namespace)."""
        url = (url or self.url).rstrip("/")
        out = {"OPENAI_BASE_URL": f"{url}/s/{self.token}/v1", "OPENAI_API_KEY": self.api_key,
               "OPENAI_MODEL": self.model, "HRL_URL": url, "HRL_SESSION_TOKEN": self.token,
               "HRL_MODEL": self.model}  # fmt: skip
        if self.agent_key:
            out["HRL_AGENT_KEY"] = self.agent_key
        if self.browser is not None:
            out["HRL_BROWSER"] = json.dumps(self.browser)
        if self.options:
            out["HRL_AGENT_OPTIONS"] = json.dumps(self.options)
        return out

    def openai(self, **options: Any) -> Any:
        """An `openai.AsyncOpenAI` bound to this session (closed when the session block ends)."""
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **options)
        self._clients.append(client)
        return client

    async def send_reward(self, value: float, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """An online run's client: the reward of this session after it ended (`POST /s/<token>/reward`), within the
        run's `online.max_reward_delay_s` to be trained as on time. The proxy's answer: {trace_id, trained, late?}."""
        if not self._client_key:
            raise SessionAPIError("send_reward needs a session opened with a client key", hint="hrl.session(key=…)")
        body = {"reward": float(value), "info": dict(info or {})}
        return await _control(self.url, self._client_key, f"/s/{self.token}/reward", body, "")

    def reward(self, value: float | None, info: dict[str, Any] | None = None) -> None:
        """The episode's reward (and why), sent when the session ends; in a rollout it replaces the verifier's."""
        self.reward_value = None if value is None else float(value)
        self.reward_info = dict(info or {})

    @contextlib.asynccontextmanager
    async def child(self, name: str, trainable: bool = True) -> AsyncIterator[WhiteboxSession]:
        """A sub-agent: its own session token whose calls are recorded into this trace as agent `name`, a child of
        this one. `trainable=False`: recorded, never trained on. Inside the block `current_session()` is the child."""
        if not self.agent_key:
            raise SessionAPIError(f"sub-agent {name!r} needs the session's agent key", hint=_AGENT_HINT)
        body = {"name": name, "trainable": trainable}
        reg = await _control(self.url, self.agent_key, f"/s/{self.token}/children", body, _AGENT_HINT)
        kid = WhiteboxSession(self.url, reg["token"], self.model, self.agent_key, task=self.task, name=name,
                              trainable=trainable)  # fmt: skip
        reset = _CURRENT.set(kid)
        try:
            yield kid
        finally:
            _CURRENT.reset(reset)
            await kid._close_clients()
            with contextlib.suppress(SessionAPIError):  # the root may have ended it already
                kid.result = await _control(self.url, self.agent_key, f"/s/{kid.token}/retire", {}, _AGENT_HINT)

    async def _close_clients(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()

    @contextlib.contextmanager
    def _current(self) -> Any:
        reset = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(reset)


def _task_meta(task: Any) -> dict[str, Any]:
    if task is None:
        return {}
    t = task if isinstance(task, dict) else task.model_dump() if hasattr(task, "model_dump") else {"id": str(task)}
    task_id = t.get("instance_id") or t.get("task_id") or t.get("id")
    return {"task_id": None if task_id is None else str(task_id)}


@contextlib.asynccontextmanager
async def session(
    task: Any = None,
    *,
    url: str | None = None,
    control_token: str | None = None,
    key: str | None = None,
    model: str | None = None,
    agent: str = "python",
    group_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> AsyncIterator[WhiteboxSession]:
    """Register a session on the proxy at `url` (default: $HRL_URL) with `control_token` (default:
    $HRL_CONTROL_TOKEN), yield it, and end it on exit with the reward given to `s.reward` (an exception ends it
    as `agent_crash` and propagates). `model`: the name to send (default: the one the proxy serves). The control
    token stays in this function: the session it yields holds the registration's agent key only.

    `key` (default $HRL_CLIENT_KEY, when no control token is given): an online run's client key (`hrl train
    --serve`, docs/online.md). The session is the client's (`group_id` its group), it ends with the reward given,
    or without one, and `await s.send_reward(r)` sends one later."""
    url = (url or os.environ.get("HRL_URL") or "").rstrip("/")
    control_token = control_token or os.environ.get("HRL_CONTROL_TOKEN")
    key = key or (None if control_token else os.environ.get("HRL_CLIENT_KEY"))
    if url and key:
        async with _client_session(task, url, key, model, group_id, metadata) as s:
            yield s
        return
    if not url or not control_token:
        raise SessionAPIError(
            "hrl.session() needs the proxy's url and control token",
            hint="start `hrl serve --control-token-file F` and pass url=… and control_token=open(F).read().strip()",
        )
    meta = {**_task_meta(task), "group_id": group_id, "agent": {"name": agent}, "metadata": dict(metadata or {})}
    reg = await _control(url, control_token, "/sessions", meta)
    s = WhiteboxSession(url, reg["token"], model or await _served_model(url), reg.get("agent_key"), task=task)
    outcome: dict[str, Any] = {}
    try:
        with s._current():
            yield s
    except asyncio.CancelledError:
        outcome = {"failure_reason": "cancelled"}
        raise
    except BaseException:
        outcome = {"failure_reason": "agent_crash"}
        raise
    finally:
        await s._close_clients()
        if s.reward_value is not None:
            outcome |= {"reward": s.reward_value, "reward_info": s.reward_info}
        s.result = await _control(url, control_token, f"/s/{s.token}/end", outcome)


@contextlib.asynccontextmanager
async def _client_session(
    task: Any, url: str, key: str, model: str | None, group: str | None, metadata: dict[str, Any] | None
) -> AsyncIterator[WhiteboxSession]:
    """`session(key=…)`: a session of an online run's client, through the client routes."""
    hint = "pass the client key `hrl keys add NAME --run-dir RUN` printed (key=…)"
    body = {**_task_meta(task), "group": group, "metadata": dict(metadata or {})}
    reg = await _control(url, key, "/sessions", body, hint)
    s = WhiteboxSession(url, reg["token"], model or await _served_model(url), None, task=task)
    s._client_key = key
    crashed = False
    try:
        with s._current():
            yield s
    except BaseException:
        crashed = True
        raise
    finally:
        await s._close_clients()
        end: dict[str, Any] = {"info": s.reward_info} if s.reward_info else {}
        if s.reward_value is not None and not crashed:
            end["reward"] = s.reward_value
        if crashed:
            end["failure_reason"] = "agent_crash"
        s.result = await _control(url, key, f"/s/{s.token}/end", end, hint)


async def _served_model(url: str) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S)) as http,
        http.get(url + "/v1/models") as resp,
    ):
        data = await resp.json(content_type=None)
    return str(data["data"][0]["id"])
