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
    from hrl.runners.engines import engine_kind
    from hrl.runners.proxy.server import check_port_free

    path = materialize_model(model)
    engine = engine or default_engine()
    engine_kind(engine)  # fail on a bad engine name or a taken port before anything loads
    check_port_free(host, port)
    options = {"require_sessions": require_sessions, "idle_timeout_s": idle_timeout}
    asyncio.run(_serve(path, engine, served_name or model, options, traces, host, port))


async def _serve(
    model: str, engine: str, name: str, options: dict[str, Any], traces: Path | None, host: str, port: int
) -> None:
    from hrl.runners.stack import serving
    from hrl.runners.trace import TraceWriter

    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)  # type: ignore[union-attr]
    try:
        async with serving(model, engine, host=host, port=port, model_name=name, proxy_options=options,
                           traces=TraceWriter(traces) if traces else None,
                           say=lambda line: err.print(line, markup=False)) as stack:  # fmt: skip
            err.print(f"serving {name} on {stack.url} (sessions under /s/<token>/; Ctrl-C to stop)", markup=False)
            try:
                await asyncio.Event().wait()
            finally:
                flushed = stack.proxy.close()
                if flushed and traces:
                    err.print(f"wrote {len(flushed)} open session(s) to {traces}", markup=False)
    except asyncio.CancelledError:
        pass
