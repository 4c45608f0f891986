"""`hrl serve`: the recording proxy in front of one engine."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import err

__all__ = ["EPILOG", "serve"]

EPILOG = """Examples:

  hrl models tiny ./tiny && hrl serve --model ./tiny --traces traces.jsonl

  hrl serve --model ./tiny --engine vllm --port 8001

  hrl serve --model Qwen/Qwen2.5-0.5B-Instruct --engine http://127.0.0.1:8000   # attach to a running vLLM

  curl -s localhost:8000/s/demo/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}]}'

  curl -s -X POST localhost:8000/s/demo/end -d '{"reward": 1.0}'   # end the session, write its trace
"""


def default_engine() -> str:
    """vLLM when a GPU and vLLM are present, else the embedded CPU engine."""
    from hrl.runners.doctor import vllm_python

    return "vllm" if shutil.which("nvidia-smi") and vllm_python() else "embedded"


def serve(
    model: Annotated[
        str, typer.Option("--model", "-m", help="HF model id, local model dir, or a LoRA checkpoint (adapter dir).")
    ],
    engine: Annotated[
        str, typer.Option("--engine", "-e", help="embedded | vllm | URL of a running vLLM server (default: auto).")
    ] = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 8000,
    traces: Annotated[Path | None, typer.Option(help="Append one hrl.trace/1 line per finished session here.")] = None,
    require_sessions: Annotated[
        bool, typer.Option(help="Serve only sessions registered with POST /sessions (others get a 401).")
    ] = False,
    idle_timeout: Annotated[float, typer.Option(help="End a session after this many idle seconds; 0 = never.")] = 1800,
    served_name: Annotated[str, typer.Option(help="Model name reported to clients (default: --model).")] = "",
) -> None:
    """Run the recording proxy: agents talk OpenAI chat / Responses, Anthropic or Gemini to it, every call is
    recorded token-exactly, and each finished session becomes one trace line."""
    from hrl.cli.config import materialize_model
    from hrl.runners.engines import make_engine
    from hrl.runners.models import split_adapter
    from hrl.runners.proxy.server import check_port_free

    path, adapter = split_adapter(materialize_model(model))
    check_port_free(host, port)
    eng = make_engine(engine or default_engine(), path)
    options = {"model_name": served_name or model, "require_sessions": require_sessions, "idle_timeout_s": idle_timeout}
    asyncio.run(_serve(eng, path, adapter, options, traces, host, port))


async def _serve(
    eng: Any, path: str, adapter: str | None, options: dict[str, Any], traces: Path | None, host: str, port: int
) -> None:
    from hrl.runners.proxy.proxy import Proxy, ProxyConfig
    from hrl.runners.proxy.server import build_app, run_server
    from hrl.runners.proxy.template import ChatTemplate
    from hrl.runners.trace import TraceWriter

    proxy = Proxy(eng, ChatTemplate(path), ProxyConfig(**options), TraceWriter(traces) if traces else None)
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)  # type: ignore[union-attr]
    err.print(f"starting {eng.name} engine for {options['model_name']} …")
    try:
        await eng.start()
        if adapter:
            err.print(f"publishing the LoRA adapter {adapter} as policy 1 …", markup=False)
            await eng.publish(adapter, "lora")
        proxy.start_reaper()
        ready = asyncio.Event()
        server = asyncio.create_task(run_server(build_app(proxy), host, port, ready))
        await asyncio.wait([server, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()
        err.print(
            f"serving {options['model_name']} on http://{host}:{port} (sessions under /s/<token>/; Ctrl-C to stop)"
        )
        await server
    except asyncio.CancelledError:
        pass
    finally:
        flushed = proxy.close()
        if flushed:
            err.print(f"wrote {len(flushed)} open session(s) to {traces}" if traces else "")
        await eng.close()
