"""More than one core: a node's proxy as N worker processes with session affinity.

Worker i of N listens on `port + i` and owns the session tokens that hash to i (`owner`: rendezvous hashing), so a session lives in
exactly one worker from its first call to its trace: its token-reuse state, its calls and its trace never leave
that process, and the trace is the one a single proxy would write. Registration picks a worker (round-robin) and
that worker draws a token it owns; the session's base URL names the worker's port. A request that reaches
another worker is refused like an unknown session (401), and a worker refuses to register a token it does not own.

The workers share the engine only through its HTTP server: with vLLM, each worker's engine client talks to the
one server (`engine_options={"url": …}`), which batches the sequences of all workers as it would one
proxy's. An in-process engine (embedded, scripted) is loaded once per worker, so N workers mean N engines (N
copies of the model for the embedded engine): fine for the deterministic scripted engine in tests and benchmarks,
not what a GPU node wants.

Each worker writes its traces to `<traces>.w<i>.jsonl` (one file per process: no interleaved appends).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from hrl.runners.errors import EngineStartError, HrlError
from hrl.runners.proxy.tokens import owner

__all__ = ["WorkerPool"]


def _worker(model: str, engine: str, index: int, port: int, opts: dict[str, Any], ready: Any, errors: Any) -> None:
    from hrl.runners.serving.loop import run
    from hrl.runners.serving.stack import serving
    from hrl.runners.trace import TraceWriter

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGTERM, signal.SIGINT):  # the pool's stop, or Ctrl-C reaching the process group
            loop.add_signal_handler(sig, task.cancel)
        traces = opts["traces"]
        writer = TraceWriter(f"{traces}.w{index}.jsonl") if traces else None
        proxy_options = {**opts["proxy_options"], "workers": opts["workers"], "worker_index": index}
        async with serving(model, engine, host=opts["host"], port=port, engine_options=opts["engine_options"],
                           traces=writer, proxy_options=proxy_options, control_token=opts["control_token"],
                           model_name=opts["model_name"]):  # fmt: skip
            ready.set()
            await asyncio.Event().wait()

    try:
        run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    except Exception as e:  # why it could not start (or serve): the pool raises it in the parent
        errors.put((index, f"{type(e).__name__}: {e}", e.hint if isinstance(e, HrlError) else None))


class WorkerPool:
    """Start N proxy workers (each the full `serving` stack on its own port) and drive their control plane.

    with WorkerPool(model, "vllm", workers=2, port=8700, control_token=T,
                    engine_options={"url": "http://gpu:8000"}) as pool:
        token, base_url = await pool.register(http, {"task_id": "t1"})   # base_url: the owning worker
    """

    def __init__(
        self,
        model: str,
        engine: str,
        *,
        workers: int,
        port: int,
        control_token: str,
        host: str = "127.0.0.1",
        engine_options: dict[str, Any] | None = None,
        proxy_options: dict[str, Any] | None = None,
        traces: str | None = None,
        model_name: str | None = None,
    ) -> None:
        self.model, self.engine, self.n, self.port, self.host = model, engine, workers, port, host
        self.control = {"Authorization": f"Bearer {control_token}"}
        self.opts = {"engine_options": engine_options or {}, "proxy_options": proxy_options or {},
                     "traces": traces, "control_token": control_token, "workers": workers,
                     "model_name": model_name, "host": host}  # fmt: skip
        self.procs: list[Any] = []
        self._next = 0

    def url(self, index: int) -> str:
        return f"http://{self.host}:{self.port + index}"

    def url_for(self, token: str) -> str:
        """The base URL of the worker that owns `token`."""
        return self.url(owner(token, self.n))

    def trace_files(self) -> list[Path]:
        return [Path(f"{self.opts['traces']}.w{i}.jsonl") for i in range(self.n)] if self.opts["traces"] else []

    def __enter__(self) -> WorkerPool:
        ctx = multiprocessing.get_context("spawn")
        errors, events = ctx.SimpleQueue(), []
        for i in range(self.n):
            ready = ctx.Event()
            args = (self.model, self.engine, i, self.port + i, self.opts, ready, errors)
            proc = ctx.Process(target=_worker, args=args)
            proc.start()
            self.procs.append(proc)
            events.append(ready)
        deadline = time.monotonic() + 600
        while not all(e.is_set() for e in events):
            dead = [i for i, p in enumerate(self.procs) if not p.is_alive() and not events[i].is_set()]
            if dead or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                index, why, hint = errors.get() if not errors.empty() else (dead[0] if dead else 0, "no answer", None)
                raise EngineStartError(f"proxy worker {index} (port {self.port + index}) did not start: {why}",
                                       hint=hint)  # fmt: skip
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()  # SIGTERM: each worker ends its open sessions (traces written) and stops
        for proc in self.procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()

    async def register(self, http: aiohttp.ClientSession, meta: dict[str, Any] | None = None) -> tuple[str, str]:
        """Register a session at the next worker (round-robin); returns (token, the session's base URL)."""
        index, self._next = self._next, (self._next + 1) % self.n
        async with http.post(f"{self.url(index)}/sessions", json=meta or {}, headers=self.control) as r:
            body = await r.json()
            if r.status != 201:
                raise RuntimeError(f"proxy worker {index} refused the registration: {body}")
        return body["token"], self.url(index) + body["base_path"]

    async def end(self, http: aiohttp.ClientSession, token: str, outcome: dict[str, Any] | None = None) -> Any:
        """End a session at its worker (the worker writes its trace); returns the worker's answer."""
        url = f"{self.url_for(token)}/s/{token}/end"
        async with http.post(url, json=outcome or {}, headers=self.control) as r:
            return await r.json()
