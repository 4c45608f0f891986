"""`hrl serve`: the recording proxy in front of one engine."""

from __future__ import annotations

import asyncio
import os
import secrets
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

  hrl serve --model ./tiny --control-token-file ./control   # the control token for the session API, mode 0600

  T=$(curl -s -H "Authorization: Bearer $(cat ./control)" -X POST localhost:8000/sessions | jq -r .token)
  curl -s localhost:8000/s/$T/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}]}'
  curl -s -H "Authorization: Bearer $(cat ./control)" -X POST localhost:8000/s/$T/end -d '{"reward": 1.0}'

  # from Python (docs/whitebox.md): async with hrl.session(url="http://127.0.0.1:8000", control_token=…) as s:

  hrl serve --model ./tiny --open-sessions   # any token opens a session (manual use on a trusted machine only)

  hrl serve --model ./tiny --sampling honest   # temperature 1, no-op top_p/top_k/penalties: traces to train on

  hrl serve --model ./tiny --media drop   # answer requests holding images without them, flagged in the trace

  hrl serve --model Qwen/Qwen2.5-0.5B-Instruct --engine http://127.0.0.1:8000 --port 8100 --workers 4
      # 4 proxy processes on ports 8100-8103 sharing one vLLM; a session lives in the worker it registered at
"""


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
    from hrl.runners.doctor.checks import vllm_python

    return "vllm" if shutil.which("nvidia-smi") and vllm_python() else "embedded"


def serve(
    model: Annotated[
        str, typer.Option("--model", "-m", help="HF model id, local model dir, or a LoRA checkpoint (adapter dir).")
    ],
    engine: Annotated[
        str, typer.Option("--engine", "-e", help="embedded | vllm | URL of a running vLLM server (default: auto).")
    ] = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port to listen on; 0 = a free one.")
    ] = 8000,
    traces: Annotated[Path | None, typer.Option(help="Append one hrl.trace/1 line per finished session here.")] = None,
    control_token_file: Annotated[
        Path | None,
        typer.Option(
            help="Write a fresh control token here (mode 0600); the session API (register, list, end), "
            "publish and pause need it as `Authorization: Bearer <token>`. Default: "
            "$HRL_STATE_DIR/control-token (~/.local/state/hrl/control-token)."
        ),
    ] = None,
    open_sessions: Annotated[
        bool,
        typer.Option(
            help="Open a session for any token a request names (quick manual use on a trusted "
            "machine; anyone who reaches the port can then write traces). Default: registered only."
        ),
    ] = False,
    require_sessions: Annotated[bool, typer.Option(hidden=True, help="The default now; kept for old scripts.")] = True,
    idle_timeout: Annotated[
        float, typer.Option(min=0, help="End a session after this many idle seconds; 0 = never.")
    ] = 1800,
    served_name: Annotated[str, typer.Option(help="Model name reported to clients (default: --model).")] = "",
    tool_parser: Annotated[
        str,
        typer.Option(
            help="How the model writes tool calls: hermes, qwen3-coder, glm45, llama3, mistral, deepseek-v3, "
            "kimi-k2, gpt-oss; auto = detected from its chat template and config.json."
        ),
    ] = "auto",
    tool_prompt: Annotated[
        str,
        typer.Option(
            help="Tools for a model whose chat template cannot show them: hermes shows them in the Hermes tool prompt "
            "(and reads calls with the hermes parser), refuse answers such a request with a 400; auto = hermes. A "
            "template that shows tools is used as it is."
        ),
    ] = "auto",
    reasoning_parser: Annotated[
        str,
        typer.Option(
            help="How the model writes its reasoning: think, think-open (the template opens <think>), mistral, "
            "harmony (gpt-oss); auto = from its chat template."
        ),
    ] = "auto",
    sampling: Annotated[
        str,
        typer.Option(
            help="agent: sample with the agent's temperature, top_p, top_k, min_p and penalties; honest: temperature "
            "1 and no-op knobs on every call, whatever the agent sends (what hrl train uses; for training on the "
            "traces with your own trainer). Each call records what was asked and what was used."
        ),
    ] = "agent",
    media: Annotated[
        str,
        typer.Option(
            help="A request holding media the model cannot take (an image for a model without vision, a document, "
            "audio). refuse: a 400 naming the part; drop: answered without it, counted in the trace (dropped_media). "
            "A vision model's images are served."
        ),
    ] = "refuse",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Proxy worker processes (ports PORT … PORT+N-1), each serving the sessions whose token it owns; "
            "N > 1 needs --engine URL of a vLLM server they share. Traces go to TRACES.w<i>.jsonl.",
        ),
    ] = 1,
) -> None:
    """Run the recording proxy: agents talk OpenAI chat / Responses, Anthropic or Gemini to it, every call is
    recorded token-exactly, and each finished session becomes one trace line."""
    from hrl.cli.checks import check_engine, check_model
    from hrl.cli.config import materialize_model
    from hrl.runners.placement import check_port_free
    from hrl.runners.proxy.reasoning import check_reasoning_name
    from hrl.runners.proxy.toolparsers import check_name

    engine = engine or default_engine()
    check_name(tool_parser)
    check_reasoning_name(reasoning_parser)
    if sampling not in ("agent", "honest"):
        from hrl.runners.errors import UsageError

        raise UsageError(f"unknown --sampling {sampling!r}", hint="use --sampling agent or --sampling honest")
    from hrl.runners.proxy.toolprompt import TOOL_PROMPTS

    if tool_prompt not in TOOL_PROMPTS:
        from hrl.runners.errors import UsageError

        raise UsageError(f"unknown --tool-prompt {tool_prompt!r}", hint="use --tool-prompt auto, hermes or refuse")
    if media not in ("refuse", "drop"):
        from hrl.runners.errors import UsageError

        raise UsageError(f"unknown --media {media!r}", hint="use --media refuse or --media drop")
    check_engine(engine)  # fail on a bad engine name, model path or a taken port before anything loads
    check_port_free(host, port)
    path = materialize_model(model)
    check_model(path)
    options = {"open_sessions": open_sessions, "idle_timeout_s": idle_timeout, "tool_parser": tool_parser,
               "reasoning_parser": reasoning_parser, "sampling": sampling, "media": media,
               "tool_prompt": tool_prompt}  # fmt: skip
    token_file = control_token_file or default_control_token_file()
    if workers > 1:
        _serve_workers(path, engine, served_name or model, options, traces, host, port, token_file, workers)
        return
    from hrl.runners.placement import run_serving

    run_serving(_serve(path, engine, served_name or model, options, traces, host, port, token_file))


def _serve_workers(
    model: str,
    engine: str,
    name: str,
    options: dict[str, Any],
    traces: Path | None,
    host: str,
    port: int,
    token_file: Path,
    workers: int,
) -> None:
    from hrl.runners.engines import is_server_url
    from hrl.runners.errors import HrlError
    from hrl.runners.placement import check_port_free, proxy_workers

    if not is_server_url(engine):
        raise HrlError(
            f"--workers {workers} needs an engine the workers share over HTTP, not {engine!r} (an in-process "
            "engine would be loaded once per worker)",
            hint="start a vLLM server and pass its URL: hrl serve --engine http://HOST:PORT --workers N",
        )
    for i in range(1, workers):
        check_port_free(host, port + i)
    control = secrets.token_urlsafe(32)
    pool = proxy_workers(model, engine, workers, port=port, host=host, control_token=control, model_name=name,
                         proxy_options=options, traces=str(traces) if traces else None)  # fmt: skip
    with pool:
        write_control_token(token_file, control)
        err.print(f"tool calls parsed as {_parser_name(model, options['tool_parser'])}", markup=False)
        err.print(f"control token in {token_file}; register sessions at any worker, each answers with a session "
                  "it owns", markup=False)  # fmt: skip
        err.print(f"serving {name} on {pool.url(0)} … {pool.url(workers - 1)} ({workers} workers; Ctrl-C to stop)",
                  markup=False)  # fmt: skip
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            pass  # leaving the pool stops every worker; each writes its open sessions' traces first


async def _serve(
    model: str,
    engine: str,
    name: str,
    options: dict[str, Any],
    traces: Path | None,
    host: str,
    port: int,
    token_file: Path,
) -> None:
    from hrl.runners.placement import serve_proxy
    from hrl.runners.proxy.toolprompt import tool_prompt_note

    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)  # type: ignore[union-attr]
    control = secrets.token_urlsafe(32)  # 256 random bits, fresh for every start
    try:
        async with serve_proxy(model, engine, host=host, port=port, model_name=name, proxy_options=options,
                               control_token=control, traces=traces,
                               say=lambda line: err.print(line, markup=False)) as stack:  # fmt: skip
            write_control_token(token_file, control)
            how = "detected from the model" if options["tool_parser"] == "auto" else "--tool-parser"
            err.print(f"tool calls parsed as {stack.proxy.template.tool_parser.name} ({how})", markup=False)
            if not stack.proxy.template.shows_tools:
                note = tool_prompt_note(False, options["tool_prompt"])
                err.print(f"tool prompt: {note}", markup=False)
            how = "detected from the model" if options["reasoning_parser"] == "auto" else "--reasoning-parser"
            err.print(f"reasoning parsed as {stack.proxy.template.reasoning_parser.name} ({how})", markup=False)
            if options["sampling"] == "honest":
                err.print("sampling honest: every call at temperature 1 with no top-p, top-k, min-p or penalties, "
                          "whatever the agent sends", markup=False)  # fmt: skip
            err.print(f"control token in {token_file} (send it as `Authorization: Bearer …` to /sessions, "
                      "/s/<token>/end, /publish, /pause)", markup=False)  # fmt: skip
            if options["open_sessions"]:
                err.print("warning: --open-sessions: any request opens a session; anyone who reaches the port can "
                          "write traces", markup=False)  # fmt: skip
            err.print(f"serving {name} on {stack.url} (sessions under /s/<token>/; Ctrl-C to stop)", markup=False)
            try:
                await asyncio.Event().wait()
            finally:
                flushed = stack.proxy.close()
                if flushed and traces:
                    err.print(f"wrote {len(flushed)} open session(s) to {traces}", markup=False)
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
