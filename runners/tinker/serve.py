"""`hrl serve --tinker`: a Tinker-compatible training service on this machine, stood up in one place: the client keys,
the run directory, hrl's engine for sampling, LoRA training models (`TrainerFactory`, handed in: torch lives in
`hrl.train`), and the HTTP server, until SIGINT or SIGTERM.

The run directory (layout `hrl.runners.rundir`): `config.json`, `traces/iter-<version>.jsonl` (every sample, by the
policy version it came from; 0 = the base model), `checkpoints/<model_id>/{weights,sampler_weights}/<name>/`."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from hrl.runners.errors import UsageError
from hrl.runners.online.keys import ClientKeys
from hrl.runners.rundir import RunDir
from hrl.runners.tinker.service import TinkerService, TrainerFactory

__all__ = ["TinkerConfig", "serve_tinker"]

Say = Callable[[str], object]


class TinkerConfig(BaseModel):
    """What `hrl serve --tinker` serves, and where."""

    model: str = Field(description="The base model's folder (a resolved model).")
    name: str = Field(description="The base model's name, as clients ask for it (create_lora_training_client).")
    engine: str = Field("embedded", description="The engine samplers run on: embedded, vllm, or a vLLM URL.")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="0 = a free one.")
    keys_file: Path = Field(description="The client keys file (`hrl keys add NAME --keys-file F`).")
    run_dir: Path = Field(description="Traces of every sample, and the checkpoints clients save.")


def serve_tinker(config: TinkerConfig, make_trainer: TrainerFactory, say: Say) -> None:
    """Serve until Ctrl-C or SIGTERM; refuse to start without a client key (nothing could call it)."""
    from hrl.runners.serving.loop import run

    keys = ClientKeys(config.keys_file)
    if not keys.names():
        raise UsageError(f"no client keys in {config.keys_file}: every Tinker call needs one",
                         hint=f"hrl keys add NAME --keys-file {config.keys_file}  # prints the tml-… API key")  # fmt: skip
    rundir = RunDir(config.run_dir)
    with rundir.locked():
        rundir.traces.mkdir(parents=True, exist_ok=True)
        (rundir.path / "config.json").write_text(json.dumps({"tinker": config.model_dump(mode="json"),
                                                             "started_at": time.time()}, indent=2))  # fmt: skip
        run(_serve(config, keys, rundir, make_trainer, say))


async def _serve(
    config: TinkerConfig, keys: ClientKeys, rundir: RunDir, make_trainer: TrainerFactory, say: Say
) -> None:
    from transformers import AutoTokenizer

    from hrl.runners.engines import make_engine
    from hrl.runners.proxy.server import bound_socket, run_server
    from hrl.runners.tinker.sampling import Samplers
    from hrl.runners.tinker.server import build_app

    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main.cancel)  # type: ignore[union-attr]
    listener = bound_socket(config.host, config.port)  # held from now on; listening once the engine is up
    url = f"http://{config.host}:{listener.getsockname()[1]}"
    say(f"loading {config.name} into the {config.engine} engine …")
    engine = make_engine(config.engine, config.model)
    decode = AutoTokenizer.from_pretrained(config.model).decode  # stop strings are looked for in the decoded text
    service = TinkerService(config.name, config.model, rundir.checkpoints, make_trainer)
    samplers = Samplers(engine, config.name, rundir.trace_file, decode)
    app = None
    try:
        await engine.start()
        app = build_app(service, samplers, keys, engine.max_model_len)
        say(f"client keys in {config.keys_file}: the SDK's api_key is tml-<key> (hrl keys add NAME --keys-file …)")
        say(f"traces and checkpoints in {config.run_dir}")
        say(f"serving the Tinker API for {config.name} on {url} (TINKER_BASE_URL={url}; Ctrl-C to stop)")
        await run_server(app, config.host, config.port, sock=listener)
    except asyncio.CancelledError:
        pass
    finally:
        if app is not None:
            await app["tinker"].futures.close()
        await engine.close()
        listener.close()
