"""`hrl serve`: serve one engine behind an OpenAI-compatible chat endpoint."""

from __future__ import annotations

import asyncio
import shutil
from typing import Annotated

import typer

from hrl.cli.output import err

__all__ = ["EPILOG", "serve"]

EPILOG = """Examples:

  hrl models tiny ./tiny && hrl serve --model ./tiny

  hrl serve --model ./tiny --engine vllm --port 8001

  hrl serve --model Qwen/Qwen2.5-0.5B-Instruct --engine http://127.0.0.1:8000   # attach to a running vLLM
"""


def default_engine() -> str:
    """vLLM when a GPU and vLLM are present, else the embedded CPU engine."""
    from hrl.runners.doctor import vllm_python

    return "vllm" if shutil.which("nvidia-smi") and vllm_python() else "embedded"


def serve(
    model: Annotated[str, typer.Option("--model", "-m", help="HF model id or local model dir.")],
    engine: Annotated[
        str, typer.Option("--engine", "-e", help="embedded | vllm | URL of a running vLLM server (default: auto).")
    ] = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 8000,
    served_name: Annotated[str, typer.Option(help="Model name reported to clients (default: --model).")] = "",
) -> None:
    """Serve a model over HTTP (OpenAI /v1/chat/completions and /v1/models), streaming and not, with tool calls."""
    from hrl.runners.engines import make_engine
    from hrl.runners.models import resolve_model
    from hrl.runners.proxy.server import check_port_free

    path = resolve_model(model)
    check_port_free(host, port)
    eng = make_engine(engine or default_engine(), path)
    asyncio.run(_serve(eng, path, served_name or model, host, port))


async def _serve(eng, path: str, name: str, host: str, port: int) -> None:  # type: ignore[no-untyped-def]
    from hrl.runners.proxy.server import build_app, run_server
    from hrl.runners.proxy.template import ChatTemplate

    template = ChatTemplate(path)
    err.print(f"starting {eng.name} engine for {name} …")
    try:
        await eng.start()
        ready = asyncio.Event()
        task = asyncio.create_task(run_server(build_app(eng, template, name), host, port, ready))
        await asyncio.wait([task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        err.print(f"serving {name} on http://{host}:{port}/v1 (Ctrl-C to stop)")
        await task
    finally:
        await eng.close()
