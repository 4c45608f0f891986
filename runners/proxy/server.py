"""HTTP front of the recording proxy: session routing, the four agent dialects, SSE streaming, the control API.

Data plane — what an agent reaches (the proxy port, the sandbox relay). Each route also under `/s/<token>/`,
which names the session; the API key `hrl-<token>` works too. Only registered sessions are served (else 401 in
the dialect's error shape), unless the proxy runs with `open_sessions`:
  POST /v1/chat/completions · /v1/responses · /v1/messages (+ /count_tokens) ·
       /v1beta/models/<model>:generateContent | :streamGenerateContent
  GET  /v1/models · /health        HEAD / (connectivity preflight)

Control plane — needs `Authorization: Bearer <control token>` (401 without, 403 with a wrong one; all 403 when the
app has no control token):
  POST /sessions (register; with {"parent": <token>, "name", "trainable"} a sub-agent whose calls join the
       parent's trace) · GET /sessions · POST /s/<token>/end (end, optionally with a reward; a sub-agent's end
       only retires its token)
  POST /publish {"path", "kind": "lora"|"full"} · POST /pause · POST /resume

Telemetry in — an agent CLI's own OpenTelemetry export (OTLP/HTTP, protobuf or JSON; runners/proxy/otel_in.py), with
the session's API key `hrl-<token>` (x-api-key or Authorization: Bearer; 401 without it, 404 for a session that is
not open here). Its tool events replace the inferred ones in the trace; nothing else of the trace changes:
  POST /s/<token>/v1/logs · /s/<token>/v1/traces · /s/<token>/v1/metrics (accepted, not read)

Agent scope — a white-box agent's credential: `Authorization: Bearer <agent key>`, the key its root session was
registered with (`agent_key` in the answer to `POST /sessions`; `Session.issue_agent_key` in process). Good for the
session tree it was issued for, and nothing else (403 otherwise; no reward, no end of a root, no control route):
  POST /s/<token>/children {"name", "trainable"} (a sub-agent of <token>) · POST /s/<child>/retire (retire one)

Client scope — an online run's client key (`hrl train --serve`, `hrl keys add`; docs/online.md):
`Authorization: Bearer hrlc-…`. It opens sessions and ends and rewards its own, nothing else (403 on every other
control route; a session of another key is a 404, as an unknown one):
  POST /sessions {task_id?, group?, metadata?} → {token, base_url} · POST /s/<token>/end {reward?, info?} ·
  POST /s/<token>/reward {reward, info?}

A request that cannot be served (bad JSON, wrong types, a conversation the template cannot render) is a 4xx in
its dialect's shape naming the problem, and is recorded in its session's trace (`rejected`); never a 500.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hmac
import json
import math
import socket
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from hrl.runners.errors import ClientError, ContextLengthError, EngineError, PortInUseError
from hrl.runners.proxy.dialects import (
    BadRequestError,
    ChatRequest,
    MediaRefusedError,
    ToolsRefusedError,
    check_request,
    get_dialect,
)
from hrl.runners.proxy.jsonio import dumps_str
from hrl.runners.proxy.otel_in import MAX_BODY_BYTES, TelemetryDecodeError, TelemetryUnsupportedError, read
from hrl.runners.proxy.proxy import MediaTooLargeError, Proxy, SessionEndedError, UnknownSessionError
from hrl.runners.proxy.session import ChildLimitError, SessionBusyError
from hrl.runners.proxy.streaming import write_stream

__all__ = ["bound_socket", "build_app", "check_port_free", "run_server"]

_SESSION_HEADERS = ("x-session-id", "session-id", "x-claude-code-session-id")


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError if host:port cannot be bound (before starting anything expensive)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise PortInUseError(f"port {port} on {host} is in use ({e.strerror})") from e


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one) and not yet listening, made before anything slow starts; the
    server listens on it once it is ready (until then a connection is refused, as before the port was held). A port
    only picked, then closed, is free for whoever binds next, such as the engine's own server picking its port
    during the minutes the engine takes to start. Bound without SO_REUSEADDR, so that no server binding with it
    (vLLM's does) can share the port meanwhile; a given port that a previous run left in TIME_WAIT is bound with it.
    Raises PortInUseError."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE or port == 0:
                raise
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # fails too if anything listens there
            s.bind((host, port))
        s.setblocking(False)
    except OSError as e:
        s.close()
        raise PortInUseError(f"cannot listen on {host}:{port} ({e.strerror})") from e
    return s


def _route(path: str) -> tuple[str | None, str]:
    """Split `/s/<token>/rest` into (token, '/rest')."""
    if path.startswith("/s/"):
        token, _, rest = path[3:].partition("/")
        return token or None, "/" + rest
    return None, path


def _dialect_for(method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    p = path.rstrip("/")
    if p.endswith("/chat/completions"):
        return "chat", {}
    if p.endswith("/responses"):
        return "responses", {}
    if p.endswith("/messages/count_tokens"):
        return "anthropic", {"count_tokens": True}
    if p.endswith("/messages"):
        return "anthropic", {}
    if "/models/" in p and ":" in p.rsplit("/", 1)[-1]:
        model, _, verb = p.rsplit("/", 1)[-1].partition(":")
        if verb in ("generateContent", "streamGenerateContent"):
            return "gemini", {"model": model, "stream": verb == "streamGenerateContent"}
    return None


def _api_key_token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    for key in (
        auth.removeprefix("Bearer ").strip(),
        request.headers.get("x-api-key", ""),
        request.headers.get("x-goog-api-key", ""),
        request.query.get("key", ""),
    ):
        if key.startswith("hrl-") and len(key) > 4:
            return key[4:]
    return None


# What a request may raise while it is parsed, checked and planned: all of it is the request's fault.
_BAD_INPUT = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, UnicodeError)
_CONTROL = ("/sessions", "/publish", "/pause", "/resume")
_SCOPED = ("/children", "/retire")  # agent-key routes under /s/<token>/
_TELEMETRY = ("/v1/traces", "/v1/logs", "/v1/metrics")  # OTLP/HTTP under /s/<token>/


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _refusal(e: Exception) -> tuple[int, str]:
    """The status and message that refuse a request whose reading, counting or planning raised `e`."""
    if isinstance(e, ContextLengthError):
        return 400, str(e)
    if isinstance(e, (ChildLimitError, SessionBusyError)):  # past proxy.max_children or max_queued_prompts: counted
        return 429, f"{e} ({e.hint})"
    if isinstance(e, SessionEndedError):
        return 409, str(e)
    if isinstance(e, MediaRefusedError):  # proxy.media: refuse, an image over a limit; well formed, not malformed
        return 413 if isinstance(e, MediaTooLargeError) else 400, str(e)
    if isinstance(e, ToolsRefusedError):  # proxy.tool_prompt: refuse, for a template that cannot show tools
        return 400, str(e)
    if isinstance(e, _BAD_INPUT):
        if isinstance(e, ValueError):  # JSONDecodeError and BadRequestError are ValueErrors
            return 400, f"malformed request: {e}"
        return 400, f"malformed request ({type(e).__name__}: {e})"
    # the template or tokenizer refused this conversation: still the request's doing
    return 422, f"cannot render this conversation with the model's chat template ({type(e).__name__}: {e})"


class _Handler:
    def __init__(self, proxy: Proxy, control_token: str | None, clients: Any = None) -> None:
        self.proxy, self.control_token, self.clients = proxy, control_token, clients

    def _client(self, request: web.Request) -> str | None:
        """The client key's name, when the request carries a client key of this run (an online run only)."""
        if self.clients is None:
            return None
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return self.clients.keys.name_for(given)  # type: ignore[no-any-return]

    async def _client_route(self, request: web.Request, client: str, token: str | None, p: str) -> web.Response:
        """What a client key may do: open a session, end or reward its own. Everything else is refused."""
        if request.method != "POST" or not (
            (p == "/sessions" and token is None) or (token and p in ("/end", "/reward"))
        ):
            return _error(403, "a client key opens sessions and ends and rewards its own; nothing else")
        body = await _json_or_empty(request)
        try:
            if p == "/sessions":
                out = self.clients.open(client, body)
                out["base_url"] = f"{request.url.origin()}/s/{out['token']}/v1"
                return web.json_response(out, status=201)
            assert token is not None
            if p == "/end":
                return web.json_response(await self.clients.end(client, token, body))
            return web.json_response(self.clients.reward(client, token, body))
        except ClientError as e:
            return _error(e.status, str(e))

    def _control_denied(self, request: web.Request) -> web.Response | None:
        """None when the request carries the control token; else the 401/403 that refuses it."""
        auth = request.headers.get("Authorization", "")
        if self.clients is not None:  # an online run: who knocks here is a client, told of client keys
            if not auth.startswith("Bearer "):
                return _error(401, "send Authorization: Bearer <client key> (`hrl keys add NAME` makes one)")
            if auth.removeprefix("Bearer ").startswith(("hrl-", self.clients.keys.prefix)):
                return _error(401, "unknown client key (`hrl keys ls` lists this run's; `hrl keys add NAME`)")
        elif not auth.startswith("Bearer ") or auth.removeprefix("Bearer ").startswith("hrl-"):
            return _error(401, "control route: send Authorization: Bearer <control token> (see `hrl serve --help`)")
        given = auth.removeprefix("Bearer ").strip().encode()
        if self.control_token is None or not hmac.compare_digest(given, self.control_token.encode()):
            return _error(403, "unknown client key, or wrong control token" if self.clients is not None
                          else "control route: wrong control token")  # fmt: skip
        return None

    def _token(self, request: web.Request, path_token: str | None) -> str:
        if path_token:
            return path_token
        token = _api_key_token(request)
        if token:
            return token
        for h in _SESSION_HEADERS:
            if request.headers.get(h):
                return request.headers[h]
        return "default"

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except BadBodyError as e:  # a control, client or agent route's body: nothing was changed
            return _error(400, str(e))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        token, path = _route(request.path)
        p = path.rstrip("/")
        if request.method == "HEAD":
            return web.Response(status=200)
        if p in _CONTROL or (token and p in ("/end", "/reward")):
            client = self._client(request)
            if client is not None:
                return await self._client_route(request, client, token, p)
            if p == "/reward":
                return _error(401, "reward route: send Authorization: Bearer <client key> (hrl keys add)")
            return await self._control(request, token, p)
        if token and p in _SCOPED:
            return await self._scoped(request, token, p)
        if token and p in _TELEMETRY:
            return await self._telemetry(request, token, p)
        if request.method == "GET":
            return await self._get(p)
        if request.method != "POST":
            return _error(405, "method not allowed")
        found = _dialect_for(request.method, path)
        if found is None:
            return _error(404, f"no route for POST {request.path}")
        name, route = found
        return await self._generate(request, name, route, self._token(request, token))

    async def _control(self, request: web.Request, token: str | None, p: str) -> web.Response:
        denied = self._control_denied(request)
        if denied is not None:
            return denied
        if request.method == "GET" and p == "/sessions":
            return web.json_response({"sessions": sorted(self.proxy.sessions)})
        if request.method != "POST":
            return _error(405, "method not allowed")
        if p == "/sessions":
            return await self._register(request)
        if p == "/end" and token:
            return await self._end(request, token)
        if p == "/publish":
            body = await _json_or_empty(request)
            if not isinstance(body.get("path"), str) or body.get("kind") not in ("lora", "full"):
                return _error(400, 'publish needs {"path": "<weights dir>", "kind": "lora" | "full"}')
            if not await asyncio.to_thread(Path(body["path"]).is_dir):  # said before anything pauses or aborts
                return _error(400, f"publish: no weights folder at {body['path']} (on the proxy's machine)")
            try:
                return web.json_response({"version": await self.proxy.publish(body["path"], body["kind"])})
            except EngineError as e:  # the engine could not load them: the agents keep the weights they had
                return _error(502, f"publish of {body['path']} failed in the engine: {e}")
        self.proxy.pause() if p == "/pause" else self.proxy.resume()
        return web.json_response({"paused": p == "/pause"})

    async def _scoped(self, request: web.Request, token: str, p: str) -> web.Response:
        """A white-box agent's own routes: open or retire a sub-agent of its tree, with the tree's agent key."""
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return _error(401, "agent route: send Authorization: Bearer <agent key> (the session's `agent_key`)")
        session = self.proxy.sessions.get(token)
        if session is None or not session.admits(auth.removeprefix("Bearer ").strip()):
            return _error(403, "agent route: not this session's agent key (or the session ended)")
        if request.method != "POST":
            return _error(405, "method not allowed")
        if p == "/retire":
            if session.root is session:
                return _error(403, "an agent key retires sub-agents only: hrl ends the episode and sets its reward")
            return web.json_response(self.proxy.end_session(token))
        body = await _json_or_empty(request)
        name, trainable = body.get("name"), body.get("trainable", True)
        if not isinstance(name, str) or not name or not isinstance(trainable, bool):
            return _error(400, "a sub-agent needs a 'name' and a boolean 'trainable'")
        try:
            child = self.proxy.open_child(token, name, trainable)
        except ChildLimitError as e:
            return _error(429, f"{e} ({e.hint})")
        return web.json_response({"token": child.token, "base_path": f"/s/{child.token}"}, status=201)

    async def _telemetry(self, request: web.Request, token: str, p: str) -> web.Response:
        """OTLP/HTTP from the session's agent CLI: its tool calls as it timed them (otel_in.py). The key is the one
        the model routes take; the body is capped like theirs; only the session's tool events and counts change."""
        if request.method != "POST":
            return _error(405, "method not allowed")
        key = _api_key_token(request)
        if key is None or not hmac.compare_digest(key.encode(), token.encode()):
            return _error(401, "telemetry: send the session's API key (hrl-<token>) as x-api-key or Bearer")
        session = self.proxy.sessions.get(token)
        if session is None:
            return _error(404, "telemetry: no such session open on this proxy (it ended, or was never registered)")
        cap = min(self.proxy.config.max_body_bytes, MAX_BODY_BYTES)
        too_large = _error(413, f"telemetry body over the limit of {cap} bytes")
        if (request.content_length or 0) > cap:
            return too_large
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return too_large
        if len(raw) > cap:
            return too_large
        try:  # off the loop: a large export takes a while to parse
            items = await asyncio.to_thread(read, p.rsplit("/", 1)[-1], raw, request.content_type)
        except TelemetryUnsupportedError as e:
            return _error(415, str(e))
        except (TelemetryDecodeError, *_BAD_INPUT) as e:
            return _error(400, f"telemetry: {e}")
        if self.proxy.sessions.get(token) is not session:
            return _error(404, "telemetry: the session ended while its export was read")
        session.telemetry.add(items, session.root.started_at)
        if request.content_type == "application/json":
            return web.json_response({})
        return web.Response(body=b"", content_type="application/x-protobuf")  # an empty Export*ServiceResponse

    async def _get(self, p: str) -> web.Response:
        if p == "/health":
            return web.json_response({"status": "ok"})
        if p.endswith("/models"):
            name = self.proxy.config.model_name
            return web.json_response(
                {
                    "object": "list",
                    "data": [{"id": name, "object": "model", "owned_by": "hrl"}],
                    "models": [{"name": f"models/{name}"}],
                }
            )
        return _error(404, f"no route for GET {p}")

    async def _register(self, request: web.Request) -> web.Response:
        body = await _json_or_empty(request)
        token = body.pop("token", None)
        if token is not None and (not isinstance(token, str) or not token.isascii() or not 16 <= len(token) <= 128):
            return _error(400, "'token' must be 16 to 128 ASCII characters (omit it to get a random one)")
        parent = body.pop("parent", None)
        try:
            if parent is not None:
                name, trainable = body.get("name"), body.get("trainable", True)
                if (
                    not isinstance(parent, str)
                    or not isinstance(name, str)
                    or not name
                    or not isinstance(trainable, bool)
                ):
                    return _error(400, "a sub-agent needs 'parent' (a session token), 'name' and a boolean 'trainable'")
                session = self.proxy.open_child(parent, name, trainable, token)
            else:
                session = self.proxy.open_session(token, body)
                key = session.issue_agent_key()  # what the agent gets: its own tree's routes, never this token
                return web.json_response({"token": session.token, "base_path": f"/s/{session.token}",
                                          "agent_key": key}, status=201)  # fmt: skip
        except UnknownSessionError:
            return _error(404, "unknown parent session (it ended, or was never registered)")
        except ChildLimitError as e:
            return _error(429, f"{e} ({e.hint})")
        except ValueError as e:
            return _error(409, str(e))
        return web.json_response({"token": session.token, "base_path": f"/s/{session.token}"}, status=201)

    async def _end(self, request: web.Request, token: str) -> web.Response:
        body = await _json_or_empty(request)
        outcome = end_outcome(body)  # every field checked before the session ends
        try:
            trace = self.proxy.end_session(token, **outcome, extra=body.get("metadata") or {})
        except UnknownSessionError:
            return _error(404, f"unknown session {token}")
        if "trace_id" not in trace:  # a sub-agent: its calls stay in its root's trace
            return web.json_response(trace)
        return web.json_response(
            {"trace_id": trace["trace_id"], "calls": len(trace["calls"]), "status": trace["status"]}
        )

    async def _generate(self, request: web.Request, name: str, route: dict[str, Any], token: str) -> web.StreamResponse:
        dialect = get_dialect(name)
        session = None

        def fail(status: int, message: str) -> web.Response:
            if session is not None:  # an unknown token (401) has no session to record it in
                session.reject(name, status, message)
            return web.json_response(dialect.error(status, message), status=status)

        try:
            session = self.proxy.session_for(token)
        except UnknownSessionError:
            return fail(401, "unknown session token: register the session first (POST /sessions, control plane)")
        if (request.content_length or 0) > self.proxy.config.max_body_bytes:
            return fail(413, f"request body over the limit of {self.proxy.config.max_body_bytes} bytes")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return fail(413, f"request body over the limit of {self.proxy.config.max_body_bytes} bytes")
        try:  # every route of a session's tree reads, counts and tokenizes under its lock (Proxy.read, begin)
            req, body_hash = await self.proxy.read(session, raw, functools.partial(self._parse, dialect, route))
            if route.get("count_tokens"):
                n = await self.proxy.count_tokens(session, req)
                return web.json_response(dialect.count_tokens_body(n))  # type: ignore[attr-defined]
            session = self.proxy.recognise(session, request.headers, req)  # a CLI's own sub-agent: a child
            call = await self.proxy.begin(session, name, req, body_hash)
        except Exception as e:
            return fail(*_refusal(e))
        rid = uuid.uuid4().hex[:24]
        if req.stream:
            return await self._stream(request, dialect, call, rid)
        try:
            async for _ in self.proxy.stream(call):
                pass
        except (EngineError, ContextLengthError) as e:
            return fail(502 if isinstance(e, EngineError) and not isinstance(e, ContextLengthError) else 400, str(e))
        return web.json_response(dialect.response(req, self.proxy.finish(call), rid), dumps=dumps_str)

    def _parse(self, dialect: Any, route: dict[str, Any], raw: bytes) -> ChatRequest:
        """The request a body holds, in the dialect's form and checked (on the loop, or in a worker thread for a
        large body: Proxy.read)."""
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        if route.get("stream"):
            body["stream"] = True
        req = dialect.parse(body, route.get("model") or self.proxy.config.model_name, self.proxy.takes_images)
        check_request(req)
        return req

    async def _stream(self, request: web.Request, dialect: Any, call: Any, rid: str) -> web.StreamResponse:
        resp = _EventStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            await write_stream(resp, self.proxy, dialect, call, rid)
        except ConnectionResetError:  # the agent hung up mid-response: the call is recorded as aborted
            call.abort()
        return resp


class _EventStream(web.StreamResponse):
    """An SSE response whose headers go out with its first event, in one write (aiohttp ≥ 3.11 honours this; an
    older one sends them at `prepare` as before): the separate header write was a large share of the serving
    process at many streaming sessions (docs/proxy.md, "Speed")."""

    _send_headers_immediately = False


class BadBodyError(ValueError):
    """A control or client route's body that is not one JSON object (a 400, said before anything changes)."""


async def _json_or_empty(request: web.Request) -> dict[str, Any]:
    """A route's JSON object body; an empty body is `{}`. Raises BadBodyError for anything else: text that is not
    JSON, JSON that is not an object, one nested past the parser's depth (a RecursionError: it was a 500)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadBodyError(f"the body is not JSON ({type(e).__name__}: {str(e)[:120]})") from e
    if not isinstance(body, dict):
        raise BadBodyError(f"the body must be a JSON object, not {type(body).__name__}")
    return body


def end_outcome(body: dict[str, Any]) -> dict[str, Any]:
    """The outcome a control `end` gives a session, checked before the session is touched: `reward` a finite
    number or null, `reward_info` and `metadata` objects, `failure_reason` one of the trace format's, `status`
    ok or failed, `success` a bool or null. Raises BadBodyError naming the field (what it wrote was unreadable)."""
    from hrl.runners.trace import FAILURE_REASONS

    reward = body.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)
                               or not math.isfinite(reward)):  # fmt: skip
        raise BadBodyError(f"'reward' must be a finite number or null, not {json.dumps(reward)[:40]}")
    for name in ("reward_info", "metadata"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise BadBodyError(f"'{name}' must be an object")
    if body.get("failure_reason") is not None and body["failure_reason"] not in FAILURE_REASONS:
        raise BadBodyError(f"'failure_reason' is one of {', '.join(FAILURE_REASONS)}, or null")
    if body.get("status") not in (None, "ok", "failed"):
        raise BadBodyError("'status' is 'ok' or 'failed', or absent")
    if body.get("success") is not None and not isinstance(body["success"], bool):
        raise BadBodyError("'success' must be true, false or null (the task's own pass/fail, apart from reward)")
    outcome = {k: body[k] for k in ("status", "failure_reason", "reward_info", "success") if body.get(k) is not None}
    return outcome | ({"reward": float(reward)} if reward is not None else {})


def build_app(proxy: Proxy, control_token: str | None = None, clients: Any = None) -> web.Application:
    """The proxy's HTTP app. Control routes need `control_token` (without one, every control request is refused).
    `clients`: an online run's `OnlineSessions`, whose client keys open the client routes."""
    app = web.Application(client_max_size=proxy.config.max_body_bytes + 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", _Handler(proxy, control_token, clients).dispatch)
    return app


async def run_server(
    app: web.Application,
    host: str,
    port: int,
    ready: asyncio.Event | None = None,
    unix_socket: str | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until cancelled on host:port, or on `sock` (from `bound_socket`) where given, and on a unix socket
    too, for sandboxes that reach only the proxy; `ready` is set once the sockets are bound."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        sites: list[web.BaseSite] = [
            web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
        ]
        if unix_socket:
            sites.append(web.UnixSite(runner, unix_socket))
        for site in sites:
            try:
                await site.start()
            except OSError as e:
                where = unix_socket if isinstance(site, web.UnixSite) else f"{host}:{port}"
                raise PortInUseError(f"cannot listen on {where} ({e.strerror})") from e
        if unix_socket:
            # Owner only. Docker agents run as the image's user, root (hrl's images set none), and root in a
            # container keeps CAP_DAC_OVERRIDE, so it connects whoever owns the socket; no other host user can.
            await asyncio.to_thread(Path(unix_socket).chmod, 0o600)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
