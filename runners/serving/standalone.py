"""`hrl serve`: the engine and the recording proxy stood up alone, for agents started elsewhere (`serve_alone`), or
a pool of proxy workers over one shared engine server (`serve_workers`); each writes a fresh control token and says
what it serves, a line at a time, to `say`. Runs are stood up through `runners.placement`, which exports these."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "default_control_token_file",
    "default_engine",
    "serve",
    "serve_alone",
    "serve_workers",
    "write_control_token",
]

Say = Callable[[str], object]


def default_control_token_file() -> Path:
    """Where `hrl serve` writes its control token without --control-token-file: $HRL_STATE_DIR/control-token
    (default ~/.local/state/hrl/control-token)."""
    from hrl.sandboxes.hidden import state_dir  # the folder local sandboxes empty: one definition of where it is

    return state_dir() / "control-token"


def write_control_token(path: Path, token: str) -> None:
    """Write the control token to `path`, readable by this user alone (0600), and record it among the paths no local
    sandbox may read, wherever it lies (`hrl.sandboxes.hidden`)."""
    from hrl.sandboxes.hidden import hide

    path.parent.mkdir(parents=True, exist_ok=True)
    hide(path)  # first: a token that cannot be recorded is never written
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through open(): set it
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)


def default_engine() -> str:
    """vLLM when a GPU and vLLM are present, else the embedded CPU engine."""
    from hrl.runners.engines.vllm_server import vllm_python

    return "vllm" if shutil.which("nvidia-smi") and vllm_python() else "embedded"


def serve(
    model: str,
    engine: str,
    name: str,
    options: dict[str, Any],
    traces: Path | None,
    host: str,
    port: int,
    token_file: Path | None,
    workers: int,
    say: Say,
) -> None:
    """`hrl serve`: `serve_alone` on the proxy's event loop, or with `workers` > 1 `serve_workers`, until Ctrl-C or
    SIGTERM; the control token goes to `token_file` (default: `default_control_token_file`)."""
    from hrl.runners.serving.loop import run

    token_file = token_file or default_control_token_file()
    if workers > 1:
        serve_workers(model, engine, name, options, traces, host, port, token_file, workers, say)
        return
    run(serve_alone(model, engine, name, options, traces, host, port, token_file, say))


def serve_workers(
    model: str,
    engine: str,
    name: str,
    options: dict[str, Any],
    traces: Path | None,
    host: str,
    port: int,
    token_file: Path,
    workers: int,
    say: Say,
) -> None:
    """`hrl serve --workers N`: N proxy processes on ports PORT … PORT+N-1 over the engine server at `engine`,
    until Ctrl-C or SIGTERM; leaving stops every worker, each writing its open sessions' traces first."""
    from hrl.runners.engines import is_server_url
    from hrl.runners.errors import HrlError
    from hrl.runners.proxy.server import check_port_free
    from hrl.runners.serving.workers import WorkerPool

    if not is_server_url(engine):
        raise HrlError(
            f"--workers {workers} needs an engine the workers share over HTTP, not {engine!r} (an in-process "
            "engine would be loaded once per worker)",
            hint="start a vLLM server and pass its URL: hrl serve --engine http://HOST:PORT --workers N",
        )
    for i in range(1, workers):
        check_port_free(host, port + i)
    control = secrets.token_urlsafe(32)
    pool = WorkerPool(model, engine, workers=workers, port=port, host=host, control_token=control, model_name=name,
                      proxy_options=options, traces=str(traces) if traces else None)  # fmt: skip
    with pool:
        write_control_token(token_file, control)
        say(f"tool calls parsed as {_parser_name(model, options['tool_parser'])}")
        say(f"control token in {token_file}; register sessions at any worker, each answers with a session it owns")
        say(f"serving {name} on {pool.url(0)} … {pool.url(workers - 1)} ({workers} workers; Ctrl-C to stop)")
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            pass  # leaving the pool stops every worker; each writes its open sessions' traces first


async def serve_alone(
    model: str,
    engine: str,
    name: str,
    options: dict[str, Any],
    traces: Path | None,
    host: str,
    port: int,
    token_file: Path,
    say: Say,
) -> None:
    """`hrl serve`: the engine and proxy on `host:port` until SIGINT or SIGTERM; each ended session is a line of
    `traces`, and the sessions still open at the end are written there too. The control routes open to a fresh
    control token, written to `token_file`."""
    from hrl.runners.proxy.toolprompt import tool_prompt_note
    from hrl.runners.serving.stack import serving
    from hrl.runners.trace import TraceWriter

    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)  # type: ignore[union-attr]
    control = secrets.token_urlsafe(32)  # 256 random bits, fresh for every start
    try:
        async with serving(
            model, engine, host=host, port=port, model_name=name, proxy_options=options, control_token=control,
            traces=TraceWriter(traces) if traces else None, say=say,
        ) as stack:  # fmt: skip
            write_control_token(token_file, control)
            how = "detected from the model" if options["tool_parser"] == "auto" else "--tool-parser"
            say(f"tool calls parsed as {stack.proxy.template.tool_parser.name} ({how})")
            if not stack.proxy.template.shows_tools:
                say(f"tool prompt: {tool_prompt_note(False, options['tool_prompt'])}")
            how = "detected from the model" if options["reasoning_parser"] == "auto" else "--reasoning-parser"
            say(f"reasoning parsed as {stack.proxy.template.reasoning_parser.name} ({how})")
            if options["sampling"] == "honest":
                say("sampling honest: every call at temperature 1 with no top-p, top-k, min-p or penalties, whatever "
                    "the agent sends")  # fmt: skip
            say(f"control token in {token_file} (send it as `Authorization: Bearer …` to /sessions, /s/<token>/end, "
                "/publish, /pause)")  # fmt: skip
            if options["open_sessions"]:
                say("warning: --open-sessions: any request opens a session; anyone who reaches the port can write "
                    "traces")  # fmt: skip
            say(f"serving {name} on {stack.url} (sessions under /s/<token>/; Ctrl-C to stop)")
            try:
                await asyncio.Event().wait()
            finally:
                flushed = stack.proxy.close()
                if flushed and traces:
                    say(f"wrote {len(flushed)} open session(s) to {traces}")
    except asyncio.CancelledError:
        pass


def _parser_name(model: str, choice: str) -> str:
    """The tool-call parser a worker pool's proxies use (they each detect it the same way: hermes for a template
    that cannot show tools, whose tools the Hermes tool prompt shows)."""
    from hrl.runners.models import split_adapter
    from hrl.runners.proxy.toolparsers import detect_model
    from hrl.runners.proxy.toolprompt import model_shows_tools

    if choice != "auto":
        return choice
    base = split_adapter(model)[0]
    if not model_shows_tools(base):
        return "hermes (its chat template cannot show tools: the proxy's hermes tool prompt shows them)"
    return f"{detect_model(base)} (detected from the model)"
