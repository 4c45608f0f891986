"""`hrl serve`: the recording proxy in front of one engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrl.cli.output import say
from hrl.runners.errors import UsageError

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

  hrl keys add me --run-dir runs/tinker && hrl serve --tinker --model hrl:tiny --port 8100 --run-dir runs/tinker
      # the Tinker training API: tinker.ServiceClient(base_url="http://127.0.0.1:8100", api_key="tml-<key>")
"""


_Model = Annotated[
    str, typer.Option("--model", "-m", help="HF model id, local model dir, or a LoRA checkpoint (adapter dir).")
]
_Engine = Annotated[
    str, typer.Option("--engine", "-e", help="embedded | vllm | URL of a running vLLM server (default: auto).")
]
_Port = Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="Port to listen on; 0 = a free one.")]
_Traces = Annotated[Path | None, typer.Option(help="Append one hrl.trace/1 line per finished session here.")]
_ControlTokenFile = Annotated[
    Path | None,
    typer.Option(
        help="Write a fresh control token here (mode 0600); the session API (register, list, end), "
        "publish and pause need it as `Authorization: Bearer <token>`. Default: "
        "$HRL_STATE_DIR/control-token (~/.local/state/hrl/control-token)."
    ),
]
_OpenSessions = Annotated[
    bool,
    typer.Option(
        help="Open a session for any token a request names (quick manual use on a trusted "
        "machine; anyone who reaches the port can then write traces). Default: registered only."
    ),
]
_RequireSessions = Annotated[bool, typer.Option(hidden=True, help="The default now; kept for old scripts.")]
_IdleTimeout = Annotated[float, typer.Option(min=0, help="End a session after this many idle seconds; 0 = never.")]
_ServedName = Annotated[str, typer.Option(help="Model name reported to clients (default: --model).")]
_ToolParser = Annotated[
    str,
    typer.Option(
        help="How the model writes tool calls: hermes, qwen3-coder, glm45, llama3, mistral, deepseek-v3, "
        "kimi-k2, gpt-oss; auto = detected from its chat template and config.json."
    ),
]
_ToolPrompt = Annotated[
    str,
    typer.Option(
        help="Tools for a model whose chat template cannot show them: hermes shows them in the Hermes tool prompt "
        "(and reads calls with the hermes parser), refuse answers such a request with a 400; auto = hermes. A "
        "template that shows tools is used as it is."
    ),
]
_ReasoningParser = Annotated[
    str,
    typer.Option(
        help="How the model writes its reasoning: think, think-open (the template opens <think>), mistral, "
        "harmony (gpt-oss); auto = from its chat template."
    ),
]
_Sampling = Annotated[
    str,
    typer.Option(
        help="agent: sample with the agent's temperature, top_p, top_k, min_p and penalties; honest: temperature "
        "1 and no-op knobs on every call, whatever the agent sends (what hrl train uses; for training on the "
        "traces with your own trainer). Each call records what was asked and what was used."
    ),
]
_Media = Annotated[
    str,
    typer.Option(
        help="A request holding media the model cannot take (an image for a model without vision, a document, "
        "audio). refuse: a 400 naming the part; drop: answered without it, counted in the trace (dropped_media). "
        "A vision model's images are served."
    ),
]
_Tinker = Annotated[
    bool,
    typer.Option(
        "--tinker",
        help="Serve the Tinker training API instead, for the official `tinker` SDK (hrl's `tinker` extra): LoRA "
        "training and sampling of --model, every sample a trace in --run-dir (docs/tinker.md).",
    ),
]
_KeysFile = Annotated[
    Path | None,
    typer.Option(help="--tinker: the client keys file (default RUN_DIR/client_keys.json; `hrl keys add NAME`)."),
]
_RunDir = Annotated[Path, typer.Option(help="--tinker: where the samples' traces and the saved checkpoints go.")]
_Workers = Annotated[
    int,
    typer.Option(
        min=1,
        help="Proxy worker processes (ports PORT … PORT+N-1), each serving the sessions whose token it owns; "
        "N > 1 needs --engine URL of a vLLM server they share. Traces go to TRACES.w<i>.jsonl.",
    ),
]


def serve(
    model: _Model,
    engine: _Engine = "",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: _Port = 8000,
    traces: _Traces = None,
    control_token_file: _ControlTokenFile = None,
    open_sessions: _OpenSessions = False,
    require_sessions: _RequireSessions = True,
    idle_timeout: _IdleTimeout = 1800,
    served_name: _ServedName = "",
    tool_parser: _ToolParser = "auto",
    tool_prompt: _ToolPrompt = "auto",
    reasoning_parser: _ReasoningParser = "auto",
    sampling: _Sampling = "agent",
    media: _Media = "refuse",
    workers: _Workers = 1,
    tinker: _Tinker = False,
    keys_file: _KeysFile = None,
    run_dir: _RunDir = Path("runs/tinker"),
) -> None:
    """Run the recording proxy: agents talk OpenAI chat / Responses, Anthropic or Gemini to it, every call is
    recorded token-exactly, and each finished session becomes one trace line. With --tinker: a Tinker-compatible
    training service instead."""
    if tinker:
        if workers != 1 or traces is not None:
            raise UsageError("--tinker serves one process and writes its traces to --run-dir",
                             hint="drop --workers and --traces")  # fmt: skip
        _serve_tinker(model, engine or "embedded", host, port, keys_file, run_dir, served_name or model)
        return
    from hrl.cli.config import materialize_model
    from hrl.runners.placement import check_port_free, default_engine
    from hrl.runners.placement import serve as serve_standalone
    from hrl.runners.preflight import check_engine, check_model, check_proxy_choices

    engine = engine or default_engine()
    check_proxy_choices(tool_parser, reasoning_parser, sampling, tool_prompt, media)
    check_engine(engine)  # fail on a bad engine name, model path or a taken port before anything loads
    check_port_free(host, port)
    path = materialize_model(model)
    check_model(path)
    options = {"open_sessions": open_sessions, "idle_timeout_s": idle_timeout, "tool_parser": tool_parser,
               "reasoning_parser": reasoning_parser, "sampling": sampling, "media": media,
               "tool_prompt": tool_prompt}  # fmt: skip
    serve_standalone(path, engine, served_name or model, options, traces, host, port, control_token_file, workers, say)


def _serve_tinker(
    model: str, engine: str, host: str, port: int, keys_file: Path | None, run_dir: Path, name: str
) -> None:
    """`hrl serve --tinker`: checks first (the SDK, the engine, the port, the model), then the service."""
    import importlib.util

    from hrl.runners.errors import PrerequisiteError

    if engine != "embedded":
        raise UsageError(f"--tinker samples with the embedded engine only, not {engine!r} (vLLM: not wired yet)",
                         hint="drop --engine (the trainer still takes the GPU when there is one)")  # fmt: skip
    if importlib.util.find_spec("tinker") is None:
        raise PrerequisiteError("--tinker needs the tinker SDK, whose types are its wire",
                                hint="pip install 'hrl[tinker]'")  # fmt: skip
    from hrl.cli.config import materialize_model
    from hrl.runners.placement import check_port_free
    from hrl.runners.preflight import check_engine, check_model
    from hrl.runners.tinker import TinkerConfig, serve_tinker
    from hrl.train.tinker_ops import TinkerLoraTrainer

    check_engine(engine)
    check_port_free(host, port)
    path = materialize_model(model)
    check_model(path)
    keys = keys_file or run_dir / "client_keys.json"
    config = TinkerConfig(model=path, name=name, engine=engine, host=host, port=port, keys_file=keys, run_dir=run_dir)
    serve_tinker(config, TinkerLoraTrainer, say)
