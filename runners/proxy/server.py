"""HTTP front of an engine: an OpenAI-compatible chat endpoint (the dialects and recording grow from here)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from typing import Any

from aiohttp import web

from hrl.runners.engines.base import Engine, Generation, SamplingParams
from hrl.runners.errors import ContextLengthError, EngineError, PortInUseError
from hrl.runners.proxy.template import ChatTemplate, parse_hermes

__all__ = ["build_app", "check_port_free", "run_server"]

MAX_BODY = 32 * 1024 * 1024


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


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _params(body: dict[str, Any], stop_ids: tuple[int, ...]) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 1024
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
        top_p=float(body.get("top_p") or 1.0),
        top_k=int(body.get("top_k") or 0),
        seed=body.get("seed"),
        stop_token_ids=stop_ids,
    )


class _Chat:
    def __init__(self, engine: Engine, template: ChatTemplate, model_name: str) -> None:
        self.engine, self.template, self.model_name = engine, template, model_name

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            messages = body["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f"malformed request: {e}")
        prompt = self.template.encode(self.template.render(messages, body.get("tools")))
        params = _params(body, self.template.stop_ids)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        stream = self.engine.generate(rid, prompt, params)
        try:
            if body.get("stream"):
                return await self._stream(request, rid, stream, len(prompt), body)
            gen = Generation()
            async for delta in stream:
                gen.add(delta)
        except ContextLengthError as e:
            return _error(400, str(e))
        except EngineError as e:
            return _error(502, str(e), "engine_error")
        return web.json_response(self._completion(rid, gen, len(prompt)))

    def _message(self, gen: Generation) -> tuple[dict[str, Any], str]:
        reply = parse_hermes(self.template.reply_text(gen.token_ids))
        msg: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            msg["tool_calls"] = reply.tool_calls
        finish = "tool_calls" if reply.tool_calls else ("length" if gen.finish_reason == "length" else "stop")
        return msg, finish

    def _completion(self, rid: str, gen: Generation, n_prompt: int) -> dict[str, Any]:
        msg, finish = self._message(gen)
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": _usage(n_prompt, len(gen.token_ids)),
        }

    async def _stream(self, request: web.Request, rid: str, stream: Any, n_prompt: int, body: dict[str, Any]):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        gen, sent, visible = Generation(), 0, ""
        first = await anext(stream, None)  # errors before the first token still get a JSON error response
        await resp.prepare(request)

        async def send(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            chunk = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model_name,
            }
            chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
            await resp.write(f"data: {json.dumps({**chunk, **extra})}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        pending = [first] if first is not None else []
        async for delta in _chain(pending, stream):
            gen.add(delta)
            text = self.template.reply_text(gen.token_ids)
            visible = text.split("<tool_call>", 1)[0]  # tool calls are sent whole at the end
            if len(visible) > sent and not visible.endswith("\ufffd"):
                await send({"content": visible[sent:]})
                sent = len(visible)
        msg, finish = self._message(gen)
        final = msg["content"] or ""
        if len(final) > sent and final.startswith(visible[:sent]):
            await send({"content": final[sent:]})
        for i, call in enumerate(msg.get("tool_calls", [])):
            await send({"tool_calls": [{"index": i, **call}]})
        await send({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk = {"id": rid, "object": "chat.completion.chunk", "model": self.model_name, "choices": []}
            await resp.write(
                f"data: {json.dumps({**chunk, 'usage': _usage(n_prompt, len(gen.token_ids))})}\n\n".encode()
            )
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def _chain(first: list[Any], rest: Any) -> Any:
    for item in first:
        yield item
    async for item in rest:
        yield item


def _usage(n_prompt: int, n_completion: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


def build_app(engine: Engine, template: ChatTemplate, model_name: str) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    chat = _Chat(engine, template, model_name)
    app.router.add_get("/health", lambda _: web.json_response({"status": "ok", "version": engine.version}))
    app.router.add_get("/v1/models", chat.models)
    app.router.add_post("/v1/chat/completions", chat.chat)
    return app


async def run_server(app: web.Application, host: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Serve until cancelled; `ready` is set once the socket is bound."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            raise PortInUseError(f"cannot listen on {host}:{port} ({e.strerror})") from e
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
