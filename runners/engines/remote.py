"""An engine in another process, over HTTP: `engine_app` serves any `Engine`, `RemoteEngine` is its client.

It is how an engine becomes a replica another machine's proxy can use: the Ray placement starts one per
`EngineReplica` actor, on the node's address; a vLLM replica's own server stays on that node's loopback, behind
it. The wire carries the engine protocol as it is, in token ids, one JSON line per delta:

  POST /generate {"request_id", "prompt_ids", "params": {…SamplingParams}, "version"} → NDJSON
       {"ids": [...], "logprobs": [...], "version": V, "finish": null|"stop"|"length"|"abort"} per delta,
       {"error": "…", "context": bool} if it failed
  POST /abort {"request_id"} · POST /pause · POST /resume · POST /publish {"path", "kind", "version"} → {"version"}
  GET  /health → {"ok", "version", "max_model_len", "continues_in_place", "loaded_versions"}
  GET  /metrics → what the engine's `read_metrics` says (vLLM: KV-cache use, waiting, prefix-cache counters), or {}

Every route, `/health` included, needs `Authorization: Bearer <token>`: a per-run secret the driver makes and hands
to the server and its clients through Ray, never through a sandbox, an agent's environment, a file or a trace.
Without it, or with another, the answer is a 401 before the body is read: nothing is generated, published, paused
or aborted.

A replica that went away (refused connection, a stream cut off) is an `EngineError`, which a `ReplicaSet` tells
from the call's own failure by probing `/health`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from hrl.runners.engines.base import Engine, ExpandedPrompt, ImageInput, PublishKind, SamplingParams, TokenDelta
from hrl.runners.errors import ContextLengthError, EngineError, EngineStartError, UsageError

__all__ = ["RemoteEngine", "RemoteEngineConfig", "engine_app", "serve_engine"]

MIN_TOKEN_CHARS = 32  # secrets.token_urlsafe(32) is 43 characters: 256 random bits


def _secret(token: str | SecretStr) -> bytes:
    """The token's bytes, refusing one too short to be a secret (an empty one would open every route)."""
    raw = token.get_secret_value() if isinstance(token, SecretStr) else token
    if len(raw) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"an engine server's token must be at least {MIN_TOKEN_CHARS} characters",
            hint="make one with secrets.token_urlsafe(32)",
        )
    return raw.encode()


def _auth(token: str | SecretStr) -> Any:
    """A middleware that answers 401 to any request without `Authorization: Bearer <token>` (compared in constant
    time), before its handler runs or its body is read."""
    want = b"Bearer " + _secret(token)

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        got = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(got, want):
            return web.json_response(
                {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": 'Bearer realm="hrl-engine"'}
            )
        return await handler(request)

    return check


async def _generate(engine: Engine, request: web.Request) -> web.StreamResponse:
    """`POST /generate`: the engine's deltas as NDJSON lines, or a line naming its error; a caller that goes away
    aborts the generation."""
    body = await request.json()
    params = SamplingParams(**{**body.get("params", {}), "stop_token_ids": tuple(body["params"].get(
        "stop_token_ids", ()))})  # fmt: skip
    images = [_image_in(i) for i in body.get("images") or []]
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    try:
        kw: dict[str, Any] = {"images": images} if images else {}
        async for d in engine.generate(body["request_id"], body["prompt_ids"], params, version=body.get("version"),
                                       **kw):  # fmt: skip
            await resp.write(json.dumps(_delta_line(d)).encode() + b"\n")
    except EngineError as e:
        err = {"error": str(e), "context": isinstance(e, ContextLengthError)}
        await resp.write(json.dumps(err).encode() + b"\n")
    except (ConnectionResetError, asyncio.CancelledError):  # the proxy went away: stop generating
        await engine.abort(body["request_id"])
        raise
    await resp.write_eof()
    return resp


def _delta_line(d: TokenDelta) -> dict[str, Any]:
    """A delta as its NDJSON line (what `RemoteEngine.generate` reads back)."""
    line: dict[str, Any] = {"ids": d.token_ids, "logprobs": d.logprobs, "version": d.version,
                            "finish": d.finish_reason}  # fmt: skip
    if d.prompt is not None:  # the first delta of a call with images: what its prompt became
        line["prompt"] = {"ids": d.prompt.prompt_ids, "placeholders": d.prompt.placeholders,
                          "processor": d.prompt.processor, "grids": d.prompt.grids}  # fmt: skip
    return line


def engine_app(engine: Engine, token: str | SecretStr) -> web.Application:
    """The HTTP face of an engine; every route answers only to `Authorization: Bearer <token>`."""

    async def control(request: web.Request) -> web.Response:
        step = request.match_info["step"]
        body = await request.json() if request.can_read_body else {}
        if step == "abort":
            await engine.abort(body["request_id"])
        elif step == "pause":
            await engine.pause()
        elif step == "resume":
            await engine.resume()
        elif step == "publish":
            version = await engine.publish(body["path"], body["kind"], body.get("version"))
            return web.json_response({"version": version, "tier": engine.last_publish_tier})
        else:
            return web.json_response({"error": f"no control step {step}"}, status=404)
        return web.json_response({"ok": True, "version": engine.version})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({
            "ok": not engine.closed,
            "version": engine.version,
            "max_model_len": int(engine.max_model_len or 0),
            "continues_in_place": bool(engine.continues_in_place),
            "takes_images": bool(engine.takes_images),
            "images_refused": engine.images_refused,
            "loaded_versions": list(engine.loaded_versions()),
        })  # fmt: skip

    async def metrics(_: web.Request) -> web.Response:
        return web.json_response(await engine.read_metrics())  # vLLM's KV-cache use and queue, for admission

    app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[_auth(token)])
    app.router.add_post("/generate", functools.partial(_generate, engine))
    app.router.add_post("/{step}", control)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_engine(
    engine: Engine, *, token: str | SecretStr, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Start `engine` and its HTTP face on host:port (0: a free port), open only to `token`; returns the runner
    (`cleanup()` stops it) and the URL. The engine is not closed by the runner: close it after."""
    app = engine_app(engine, token)  # a bad token fails before the engine starts
    await engine.start()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server else port  # type: ignore[union-attr]
    return runner, f"http://{host}:{bound}"


class RemoteEngineConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model: str = Field("", description="The served model (informational: the server loaded it).")
    url: str = Field(description="http://host:port of an `engine_app` server.")
    token: SecretStr = Field(description="The server's bearer token (the Ray placement makes one per run).")
    startup_timeout_s: float = Field(120, gt=0, description="Seconds to wait for /health at start().")
    request_timeout_s: float = Field(600, gt=0, description="Seconds allowed for a control call (publish, pause).")


class _Refused(EngineError):
    """The server answered 401: the token is not its own (retrying will not help)."""


def _image_out(image: ImageInput) -> dict[str, str]:
    return {"data": base64.b64encode(image.data).decode(), "mime": image.mime, "sha256": image.sha256}


def _image_in(wire: dict[str, str]) -> ImageInput:
    """An image as the proxy shard sent it, its bytes checked against its sha256 (the engine keys nothing by a
    hash it has not checked)."""
    try:
        data = base64.b64decode(wire["data"], validate=True)
        digest, mime = str(wire["sha256"]), str(wire["mime"])
    except (KeyError, TypeError, ValueError, binascii.Error) as e:  # a 400 naming it, never a 500
        raise web.HTTPBadRequest(text=f"an image is not base64 data with its mime type and sha256: {e}") from e
    if hashlib.sha256(data).hexdigest() != digest:
        raise web.HTTPBadRequest(text="an image's bytes do not match its sha256")
    return ImageInput(data, mime, digest)


class RemoteEngine(Engine):
    """Engine protocol over an `engine_app` server."""

    name = "remote"

    def __init__(self, config: RemoteEngineConfig) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        self._version = 0
        self._loaded: list[int] = [0]
        self.max_model_len = 0
        self.continues_in_place = False
        self.takes_images = False  # the served engine's, read from /health
        self.images_refused: str | None = None
        self.last_publish_tier = ""
        self._http: aiohttp.ClientSession | None = None

    @property
    def version(self) -> int:
        return self._version

    def loaded_versions(self) -> list[int]:
        return self._loaded

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            auth = {"Authorization": "Bearer " + self.config.token.get_secret_value()}
            limit = aiohttp.ClientTimeout(total=None, sock_connect=10)
            self._http = aiohttp.ClientSession(timeout=limit, headers=auth)
        return self._http

    async def _state(self, limit_s: float = 5) -> dict[str, Any]:
        try:
            async with self._client().get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
                if r.status == 401:
                    raise _Refused(f"engine replica at {self.url} refused this run's token (401)")
                state: dict[str, Any] = await r.json()
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            raise EngineError(f"engine replica at {self.url} does not answer: {e!r}") from e
        self._version, self._loaded = int(state["version"]), list(state.get("loaded_versions") or [state["version"]])
        self.max_model_len = int(state.get("max_model_len") or 0)
        self.continues_in_place = bool(state.get("continues_in_place"))
        self.takes_images, self.images_refused = bool(state.get("takes_images")), state.get("images_refused")
        return state

    async def start(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            try:
                await self._state()
                return
            except _Refused as e:
                await self.close()
                raise EngineStartError(str(e), hint="the server was started with another token") from e
            except EngineError as e:
                if time.monotonic() > deadline:
                    await self.close()
                    raise EngineStartError(str(e), hint="is the replica's server up? (`ray status`)") from e
                await asyncio.sleep(0.2)

    async def health(self) -> bool:
        try:
            return bool((await self._state())["ok"])
        except EngineError:
            return False

    async def read_metrics(self) -> dict[str, float]:
        try:
            async with self._client().get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                return {k: float(v) for k, v in (await r.json()).items()}
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            raise EngineError(f"engine replica at {self.url} gave no metrics: {e!r}") from e

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        version: int | None = None,
        images: list[ImageInput] | None = None,
    ) -> AsyncIterator[TokenDelta]:
        body = {"request_id": request_id, "prompt_ids": prompt_ids, "params": dataclasses.asdict(params),
                "version": version, "images": [_image_out(i) for i in images or []]}  # fmt: skip
        finished = False
        try:
            async with self._client().post(self.url + "/generate", json=body) as r:
                if r.status != 200:
                    raise EngineError(f"engine replica at {self.url} answered {r.status}: {(await r.text())[:300]}")
                async for raw in r.content:
                    line = json.loads(raw)
                    if "error" in line:
                        raise (ContextLengthError if line.get("context") else EngineError)(line["error"])
                    finished = line["finish"] is not None
                    prompt = None
                    if "prompt" in line:
                        got = line["prompt"]
                        prompt = ExpandedPrompt([int(t) for t in got["ids"]],
                                                [(int(o), int(n)) for o, n in got["placeholders"]], got.get("processor"),
                                                got.get("grids"))  # fmt: skip
                    yield TokenDelta(line["ids"], line["logprobs"], int(line["version"]), line["finish"], prompt)
        except (aiohttp.ClientError, ValueError) as e:
            raise EngineError(f"engine replica at {self.url} failed a generation: {e!r}") from e
        if not finished:
            raise EngineError(f"engine replica at {self.url} ended a generation without a finish (it went away)")

    async def _post(self, step: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        limit = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
        try:
            async with self._client().post(f"{self.url}/{step}", json=body or {}, timeout=limit) as r:
                out: dict[str, Any] = await r.json()
                if r.status != 200:
                    raise EngineError(f"engine replica at {self.url} refused {step}: {out}")
                return out
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            raise EngineError(f"engine replica at {self.url} failed {step}: {e!r}") from e

    async def abort(self, request_id: str) -> None:
        await self._post("abort", {"request_id": request_id})

    async def pause(self) -> None:
        await self._post("pause")

    async def resume(self) -> None:
        await self._post("resume")

    async def publish(self, path: str, kind: PublishKind, version: int | None = None) -> int:
        out = await self._post("publish", {"path": path, "kind": kind, "version": version})
        self._version, self.last_publish_tier = int(out["version"]), str(out.get("tier") or "")
        if self._version not in self._loaded:
            self._loaded = [*self._loaded, self._version]
        return self._version

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
