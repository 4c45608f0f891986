"""The embedded engine: in-process transformers generation for CPU and small models (or one GPU: `device`).

One scheduler thread runs batched decoding with a KV cache, continuously: a request that arrives while a batch
decodes is prefilled on a cache of its own, gets its first token, and joins the running batch at the next decode step
(its KV cache merged into the batch's); a request that finishes leaves it (its rows dropped). A batch is homogeneous
in weights: live requests, or requests pinned to one LoRA version (`_admit` says who may join; `decode._adapter_context`
why peft's mixed-batch path is not used). A full publish swaps weights in place. Pause holds the scheduler between
decode steps, so a publish lands between two tokens and each token records the version that produced it.

torch, transformers and peft are imported lazily: this module is the one place below `train` that uses them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from hrl.runners.engines.base import Engine, ExpandedPrompt, ImageInput, SamplingParams, TokenDelta
from hrl.runners.errors import ContextLengthError, EngineError, EngineStartError
from hrl.runners.models import resolve_model

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]


class EmbeddedEngineConfig(BaseModel):
    model: str = Field(description="HF model id or local model dir.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = the checkpoint's dtype."
    )
    max_batch_size: int = Field(16, ge=1, description="Most sequences decoded together in one batch.")
    max_model_len: int = Field(
        0, ge=0, description="Context window in tokens; 0 = the model's max_position_embeddings."
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = torch's default.")
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="Where the model runs: cpu, or cuda / cuda:N (one GPU; sampling stays on the CPU, so a seed "
        "draws the same tokens on either). A GPU the machine lacks is refused at start.",
    )
    max_loaded_versions: int = Field(4, ge=1, description="LoRA policy versions kept loaded for pinned traces.")
    continuous: bool = Field(
        True,
        description="Continuous batching: a request that arrives mid-decode joins the running batch at the next step. "
        "False = static batches (it waits for the whole running batch to end), kept only for comparison "
        "(bench/embedded_speed.py).",
    )


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    version: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenDelta | BaseException]
    pinned: bool = False
    pixels: dict[str, Any] | None = None  # a prompt with images: the processor's pixel inputs (one batch row)
    generated: int = 0
    aborted: bool = False
    done: bool = False
    rng: Any = field(default=None)

    def send(self, item: TokenDelta | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    @property
    def key(self) -> tuple[bool, int | None]:
        """The weights a batch row needs: live (the published version, whichever it is) or pinned to a version."""
        return self.pinned, self.version if self.pinned else None


class EmbeddedEngine(Engine):
    """Engine protocol over a transformers model running in this process."""

    name = "embedded"
    continues_in_place = True  # a publish lands between two decode steps of running requests
    expands_images = True  # a vision model's processor expands the placeholders here (`expand`)
    scores = True
    sampling_knobs = frozenset({"temperature", "top_p", "top_k", "min_p"})  # no penalties: sent as no-ops
    takes_images = False  # True once a vision model (its processor and image-text model) is loaded
    images_refused: str | None = None  # why a loaded vision model's images cannot be served here (`positions_refusal`)

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        self.config = config
        self._version = 0
        self.last_publish_tier = ""
        self._adapters: dict[int, str | None] = {0: None}  # version -> peft adapter name (None = base weights)
        self._pending: list[_Request] = []
        self._active: dict[str, _Request] = {}
        self._cv = threading.Condition()
        self._paused = False
        self._in_step = False
        self.closed = False
        self._thread: threading.Thread | None = None
        self.model: Any = None
        self.processor: Any = None  # a vision model's processor (AutoProcessor): expands images, makes pixels
        self.image_token_id: int | None = None
        self._eos: set[int] = set()
        self.max_model_len = 0
        self.device: Any = "cpu"  # the model's torch.device once loaded: decode puts its inputs there
        self.busy_s = 0.0  # wall time spent running batches (for engine/busy_frac)

    @property
    def version(self) -> int:
        return self._version

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.config.dtype

    def loaded_versions(self) -> list[int]:
        """Policy versions a request can still be pinned to."""
        return sorted(self._adapters)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._loop, name="hrl-embedded-engine", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        path = resolve_model(self.config.model)
        self.device = _device(self.config.device)
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        dtype = "auto" if self.config.dtype == "auto" else getattr(torch, self.config.dtype)
        try:
            cfg = AutoConfig.from_pretrained(path)
            if cfg.to_dict().get("vision_config") is not None:
                self._load_vision(path, dtype)
            else:
                self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            self.model.to(self.device)
        except EngineStartError:
            raise
        except Exception as e:
            raise EngineStartError(f"embedded engine could not load {self.config.model}: {e}") from e
        text_cfg = cfg.get_text_config()
        self.max_model_len = self.config.max_model_len or int(getattr(text_cfg, "max_position_embeddings", 4096))
        eos = self.model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def _load_vision(self, path: str, dtype: Any) -> None:
        """A vision-language model: its image-text model and its processor, which expands each image placeholder
        of a token prompt and makes the pixel inputs (`expand`)."""
        from transformers import AutoModelForImageTextToText

        from hrl.runners.engines.images import load_processor, positions_refusal

        self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).eval()
        self.processor, self.image_token_id = load_processor(path)
        self.takes_images = True
        self.images_refused = positions_refusal(self.model, self.processor)  # text is served; images would not be

    def expand(self, prompt_ids: list[int], images: list[ImageInput]) -> tuple[ExpandedPrompt, dict[str, Any]]:
        """The prompt with each image placeholder expanded by the model's processor, and the pixel inputs
        (`engines.images.expand_images`)."""
        from hrl.runners.engines.images import expand_images

        return expand_images(self.processor, int(self.image_token_id or 0), prompt_ids, images)

    async def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None

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
        expanded, pixels = None, None
        if images:
            if not self.takes_images:
                raise EngineError(f"the embedded engine serves {self.config.model}, which takes no images")
            if self.images_refused:
                raise EngineError(self.images_refused)
            expanded, pixels = await asyncio.to_thread(self.expand, list(prompt_ids), images)
            prompt_ids = expanded.prompt_ids
        if len(prompt_ids) + 1 > self.max_model_len:
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens does not fit the context window of {self.max_model_len}"
            )
        want = self._version if version is None else version
        if want not in self._adapters:
            raise EngineError(f"policy version {want} is not loaded (loaded: {sorted(self._adapters)})")
        loop = asyncio.get_running_loop()
        req = _Request(request_id, list(prompt_ids), params, want, loop, asyncio.Queue(), pinned=version is not None,
                       pixels=pixels)  # fmt: skip
        with self._cv:
            if self.closed:
                raise EngineError("embedded engine is closed")
            self._pending.append(req)
            self._cv.notify_all()
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if expanded is not None:  # the first delta says what the prompt became
                    item, expanded = dataclasses.replace(item, prompt=expanded), None
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            req.aborted = True  # the consumer went away: stop spending compute on it

    async def abort(self, request_id: str) -> None:
        with self._cv:
            for req in [*self._pending, *self._active.values()]:
                if req.rid == request_id:
                    req.aborted = True
            self._cv.notify_all()

    async def pause(self) -> None:
        """Return once no decode step is running; later steps wait for resume()."""
        with self._cv:
            self._paused = True
        await asyncio.to_thread(self._wait_idle)

    def _wait_idle(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._in_step)

    async def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    async def score(self, prompt_ids: list[int], ids: list[int]) -> list[float]:
        """Raw logprobs of `ids` after `prompt_ids` under the live version (one forward pass, between decode
        steps): `hrl doctor` compares them with the logprobs recorded when the same ids were sampled."""
        from hrl.runners.engines.decode import score_ids

        was_paused = self._paused
        await self.pause()
        try:
            return await asyncio.to_thread(score_ids, self, list(prompt_ids), list(ids))
        finally:
            if not was_paused:
                await self.resume()

    # ---- weights -----------------------------------------------------------------------------------------
    async def publish(self, path: str, kind: Literal["lora", "full"], version: int | None = None) -> int:
        was_paused = self._paused
        await self.pause()
        try:
            await asyncio.to_thread(self._swap, path, kind, self._version + 1 if version is None else version)
        finally:
            if not was_paused:
                await self.resume()
        return self._version

    def _swap(self, path: str, kind: str, new: int) -> None:
        if new <= self._version:
            raise ValueError(f"policy version must grow: {new} after {self._version}")
        if kind == "lora":
            self._load_adapter(path, f"v{new}")
            self._adapters[new] = f"v{new}"
            self._evict_old_adapters()
        elif kind == "full":
            self._load_full(path)
            self._adapters = {new: None}
        else:
            raise ValueError(f"unknown publish kind {kind!r} (expected 'lora' or 'full')")
        self._version = new
        self.last_publish_tier = "lora-adapter" if kind == "lora" else "disk-reload"

    def _load_adapter(self, path: str, adapter_name: str) -> None:
        from peft import PeftModel

        from hrl.runners.models import peft_quietly

        if isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=adapter_name)
        else:
            with peft_quietly():
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=adapter_name).eval()

    def _evict_old_adapters(self) -> None:
        in_use = {r.version for r in [*self._pending, *self._active.values()]}
        lora_versions = sorted(v for v, a in self._adapters.items() if a is not None)
        for v in lora_versions[: -self.config.max_loaded_versions]:
            if v not in in_use:
                self.model.delete_adapter(self._adapters.pop(v))

    def _load_full(self, path: str) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        base = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        if isinstance(self.model, PeftModel):
            self.model = self.model.unload()  # drop all adapters, keep the unmerged base weights
            base = self.model
        auto = AutoModelForImageTextToText if self.takes_images else AutoModelForCausalLM  # a vision model's whole
        new = auto.from_pretrained(resolve_model(path), dtype=base.dtype)
        with torch.no_grad():
            missing = base.load_state_dict(new.state_dict(), strict=False)
        if missing.missing_keys:
            raise EngineError(f"checkpoint {path} lacks weights: {missing.missing_keys[:5]}")

    # ---- scheduler ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self.closed or (self._pending and not self._paused))
                if self.closed:
                    for r in self._pending:
                        r.send(EngineError("embedded engine closed"))
                    return
                batch = self._next_batch()
                self._active = {r.rid: r for r in batch}
            t0 = time.monotonic()
            try:
                self._run_batch(batch)
            except Exception as e:  # a broken batch fails its requests (joiners included), never the engine
                with self._cv:
                    failed = [*batch, *self._active.values()]
                for r in {id(r): r for r in failed}.values():
                    if not r.done:
                        r.done = True
                        r.send(EngineError(f"embedded engine failed: {e}"))
            finally:
                self.busy_s += time.monotonic() - t0
                with self._cv:
                    self._active = {}
                    self._in_step = False
                    self._cv.notify_all()

    def _next_batch(self) -> list[_Request]:
        """The oldest request and those that share its weights: live ones, or ones pinned to the same version. A
        request with images runs alone (its pixels are one batch row's)."""
        key = self._pending[0].key
        batch = [r for r in self._pending if r.key == key]
        batch = [batch[0]] if batch[0].pixels is not None else [r for r in batch if r.pixels is None]
        batch = batch[: self.config.max_batch_size]
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        return batch

    def _admit(self, running: list[_Request], joinable: bool = True) -> list[_Request]:
        """Continuous batching, at the start of a decode step (after `_step_gate`): the pending requests that join
        the running batch now, taken off the queue; `running` (the rows that go on) and they become `_active`.

        The rule: pending requests join oldest first while each has the running batch's weights key (`_Request.key`),
        has no images, and the batch has room (`max_batch_size`); the first that does not stops the scan. So no
        request is overtaken by a later one: behind a request of the other key (or with images) the running batch
        admits nobody, drains, and the next batch starts with that request (`_next_batch`). A long generation delays
        a request of the other key by at most its own remaining tokens, and one of its own key by a step (unless it
        queued behind one of the other key). None join with `continuous` off, into a batch with images, or into a
        cache whose layout cannot be merged (`joinable`, see `decode._kv`)."""
        with self._cv:
            take: list[_Request] = []
            if self.config.continuous and joinable and running and all(r.pixels is None for r in running):
                room = self.config.max_batch_size - len(running)
                for r in self._pending:
                    if len(take) >= room or r.key != running[0].key or r.pixels is not None:
                        break
                    take.append(r)
                del self._pending[: len(take)]
            self._active = {r.rid: r for r in [*running, *take]}
            return take

    def _step_gate(self) -> bool:
        """Between decode steps: honour pause and close. Returns False when the engine is closing."""
        with self._cv:
            self._in_step = False
            self._cv.notify_all()
            self._cv.wait_for(lambda: self.closed or not self._paused)
            self._in_step = not self.closed
            return not self.closed

    def _run_batch(self, batch: list[_Request]) -> None:
        from hrl.runners.engines import decode

        decode.run_batch(self, batch)


def _device(name: str) -> Any:
    """The torch device `device` names, refused at start where this machine has no such GPU."""
    import torch

    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise EngineStartError(
                f"the embedded engine's engine_options.device={name}, but this machine has "
                f"{count or 'no'} CUDA GPU{'s' if count != 1 else ''} torch can use",
                hint="use -c engine_options.device=cpu" + (f" or a GPU below cuda:{count}" if count else ""),
            )
    return device
