"""The scripted engine: plays back assistant turns given as text or tool calls, as real sampled ids.

Each turn is rendered the way the model's family writes it (`engines/turns.py`: Hermes `<tool_call>` JSON,
Qwen3-Coder XML, Harmony channels, …, thinking where the family has it, then its stop token; the family is detected
from the model like the proxy's `tool_parser: auto`, or set with `family`) and tokenized with the served model's
tokenizer, then streamed token by token like any engine. It lets users check a harness integration without a
model, and lets tests drive real agent CLIs deterministically through every family. The turn played is chosen by
how many assistant turns the prompt already holds, so concurrent sessions each get their own script position.

Paced like a GPU engine (`decode_tps`, `max_batch`, `prefill_tps`): sampling costs no CPU, a sequence's i-th token
is due `prefill + i / decode_tps` seconds after it is admitted, and each wake-up hands over every token due by
then in one delta (a late wake-up, the proxy's CPU being busy, never slows the engine down). At most `max_batch`
sequences decode at once; the rest queue. `busy_s` is the time at least one sequence was admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.engines.base import Engine, ExpandedPrompt, ImageInput, SamplingParams, TokenDelta
from hrl.runners.engines.images import expand_images, load_processor, model_has_vision
from hrl.runners.engines.turns import completed_turns, hermes_turn, markers, render_family_turn
from hrl.runners.errors import EngineError
from hrl.runners.models import resolve_model

__all__ = ["ScriptedEngine", "ScriptedEngineConfig", "ScriptedTurn", "render_turn"]

_BLOCK = 16  # prefix-cache block, in tokens (vLLM's default block size)
_CACHE_BLOCKS = 65536  # blocks the prefix cache holds (about 1M tokens)

# One assistant turn to play back: text, or {"text": …, "reasoning": …, "tool_calls": [{"name": …, "arguments": {…}}]}.
ScriptedTurn = str | dict[str, Any]
MATCH = "{{match:"
_PLACEHOLDER = re.compile(r"\{\{match:(.+?)\}\}")


def _filled(turn: Any, prompt: str) -> Any:
    """`turn` with each `{{match:REGEX}}` replaced by REGEX's first group (else whole match) at its last match in
    `prompt`; `{{match:REGEX||TEXT}}` gives TEXT where REGEX matches nothing, which is otherwise an EngineError."""

    def one(m: re.Match[str]) -> str:
        pattern, _, fallback = m.group(1).partition("||")
        try:
            found = list(re.finditer(pattern, prompt))
        except re.error as e:
            raise EngineError(f"scripted turn: {m.group(0)} is not a valid regular expression ({e})") from e
        if not found:
            if "||" in m.group(1):
                return fallback
            raise EngineError(f"scripted turn: {pattern!r} matches nothing in the prompt")
        last = found[-1]
        return last.group(1) if last.re.groups else last.group(0)

    if isinstance(turn, str):
        return _PLACEHOLDER.sub(one, turn)
    if isinstance(turn, dict):
        return {k: _filled(v, prompt) for k, v in turn.items()}
    if isinstance(turn, list):
        return [_filled(v, prompt) for v in turn]
    return turn


def _finish(at: int, length: int, end: int) -> Literal["stop", "length"] | None:
    """Why a stream of a turn's `length` ids, cut at `end`, finishes once `at` of them are out (None: it goes on)."""
    if at == length:
        return "stop"
    return "length" if at == end else None


class ScriptedEngineConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model: str = Field(description="Model dir or id whose tokenizer renders the turns.")
    family: str = Field(
        "auto", description="Model family whose syntax the turns are written in (auto: detected from the model)."
    )
    turns: list[ScriptedTurn] = Field(
        default_factory=lambda: ["Done."],
        description="Assistant turns: a string, or {'text': …, 'reasoning': …, 'tool_calls': [{'name': …, "
        "'arguments': {…}}]}, optionally with 'fail_after': N to die with an engine error after N tokens. Past the "
        "end, the last turn repeats. `{{match:REGEX}}` anywhere in a turn is replaced, per call, by REGEX's first "
        "group (else its whole match) at its last match in the decoded prompt (`{{match:REGEX||TEXT}}`: TEXT where "
        "it matches nothing): an id the page or the harness made up for this episode (an element's index).",
    )
    script_file: str | None = Field(None, description="JSON file with a list of turns (overrides `turns`).")
    token_delay_s: float = Field(
        0.0, ge=0, description="Pause between streamed tokens, one token per delta (ignored when decode_tps is set)."
    )
    decode_tps: float = Field(
        0.0, ge=0, description="Paced decoding: tokens per second per sequence, due on the clock; 0 = not paced."
    )
    max_batch: int = Field(
        0, ge=0, description="Paced: most sequences decoding at once (others queue); 0 = no ceiling."
    )
    prefill_tps: float = Field(
        0.0,
        ge=0,
        description="Paced: prompt tokens per second of prefill, charged on the tokens past the longest prompt "
        "prefix this engine holds in its prefix cache (16-token blocks, like vLLM's); 0 = free prefill.",
    )
    max_model_len: int = Field(32768, ge=1, description="Context window in tokens.")
    publish_delay_s: float = Field(0.0, ge=0, description="How long a publish takes (to test waiting through one).")
    continues_in_place: bool = Field(
        True, description="Publishes apply to running requests (False: like vLLM LoRA, the proxy must resubmit)."
    )


def render_turn(turn: str | dict[str, Any], end_of_turn: str) -> str:
    """The text a Hermes-style model would sample for a turn (a `<think>` block first when it has reasoning), ending
    with the end-of-turn token."""
    return hermes_turn(turn, end_of_turn)


class ScriptedEngine(Engine):
    name = "scripted"
    takes_images = False  # True for a vision model: its processor expands images (`generate(images=)`)

    def __init__(self, config: ScriptedEngineConfig) -> None:
        self.config = config
        self.max_model_len = config.max_model_len
        self._version = 0
        self._paused = asyncio.Event()
        self._paused.set()
        self._aborted: set[str] = set()
        self._running: dict[str, object] = {}  # request id -> the generation that serves it now
        self.closed = False
        self.tokenizer: Any = None
        self.processor: Any = None  # a vision model's processor
        self.image_token_id = 0
        self.turns = list(config.turns)
        self.continues_in_place = config.continues_in_place
        self._turn_ids: dict[int, list[int]] = {}
        self._slots = asyncio.Semaphore(config.max_batch) if config.max_batch > 0 else None
        self._blocks: OrderedDict[int, None] = OrderedDict()  # the prefix cache: block hashes, least recent first
        self.busy_s = 0.0  # time with at least one sequence admitted (see `busy`)
        self.admitted = 0  # sequences decoding now
        self.waiting = 0  # sequences waiting for a slot (max_batch)
        self.seq_s = 0.0  # Σ over sequences of the time each was admitted (mean batch = seq_s / busy_s)
        self._busy_since = 0.0
        self.prompt_tokens = 0  # paced prefill: prompt tokens seen, and those served from the prefix cache
        self.cached_tokens = 0

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        from transformers import AutoTokenizer

        from hrl.runners.models import detect_model

        path = resolve_model(self.config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        family = self.config.family
        self.family = detect_model(path, self.tokenizer.chat_template) if family == "auto" else family
        if self.config.script_file:
            self.turns = json.loads(await asyncio.to_thread(Path(self.config.script_file).read_text))
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._end = (
            "<|im_end|>"
            if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id
            else self.tokenizer.eos_token
        )
        self._markers = markers(self.family, lambda t: self.tokenizer.encode(t, add_special_tokens=False))
        if model_has_vision(path):  # a vision model: its processor expands images as the model would
            self.processor, self.image_token_id = await asyncio.to_thread(load_processor, path)
            self.takes_images = True
        self._turn_ids.clear()
        self.closed = False

    def _turn_index(self, prompt_ids: list[int]) -> int:
        return completed_turns(prompt_ids, *self._markers)

    def _ids(self, index: int, prompt_ids: list[int]) -> list[int]:
        turn = self.turns[index]
        if MATCH in json.dumps(turn):  # filled from this call's prompt: not cached
            return self._render(index, _filled(turn, self.tokenizer.decode(prompt_ids)))
        if index not in self._turn_ids:
            self._turn_ids[index] = self._render(index, turn)
        return self._turn_ids[index]

    def _render(self, index: int, turn: ScriptedTurn) -> list[int]:
        if self.family == "hermes":
            text = render_turn(turn, self._end)
        else:
            before = sum(len(t.get("tool_calls") or []) for t in self.turns[:index] if isinstance(t, dict))
            text = render_family_turn(self.family, turn, before)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def busy(self) -> float:
        """Seconds with at least one sequence admitted, up to now."""
        return self.busy_s + (time.monotonic() - self._busy_since if self.admitted else 0.0)

    async def read_metrics(self) -> dict[str, float]:
        """What vLLM's /metrics says, in the names `parse_vllm_metrics` gives them: sequences decoding and waiting
        for a slot, and the paced prefix cache's counters (prompt tokens seen, those served from the cache)."""
        return {"running": float(self.admitted), "waiting": float(self.waiting),
                "prefix_queries": float(self.prompt_tokens), "prefix_hits": float(self.cached_tokens)}  # fmt: skip

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        t0 = time.monotonic()
        if not self.admitted:
            self._busy_since = t0
        self.admitted += 1
        try:
            yield
        finally:
            now = time.monotonic()
            self.admitted -= 1
            self.seq_s += now - t0
            if not self.admitted:
                self.busy_s += now - self._busy_since
            if self._slots is not None:
                self._slots.release()

    def _prefill_s(self, prompt_ids: list[int]) -> float:
        """Prefill time of the prompt tokens past the cached prefix. The cache works like vLLM's automatic prefix
        caching: full blocks of `_BLOCK` tokens, each known by the hash of everything up to its end, LRU-evicted;
        `prompt_tokens` / `cached_tokens` count what it saw and served."""
        if self.config.prefill_tps <= 0:
            return 0.0
        h, cached, hit = 0, 0, True
        for i in range(0, len(prompt_ids) - _BLOCK + 1, _BLOCK):
            h = hash((h, *prompt_ids[i : i + _BLOCK]))
            if hit and h in self._blocks:
                cached += _BLOCK
                self._blocks.move_to_end(h)
            else:
                hit = False
                self._blocks[h] = None
        while len(self._blocks) > _CACHE_BLOCKS:
            self._blocks.popitem(last=False)
        self.prompt_tokens += len(prompt_ids)
        self.cached_tokens += cached
        return (len(prompt_ids) - cached) / self.config.prefill_tps

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        version: int | None = None,
        images: list[ImageInput] | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Plays the next turn. With images (a vision model), each placeholder is expanded by the model's processor
        first, and the first delta reports the prompt that makes, as a real engine would."""
        prompt_ids, expanded = await self._prompt(prompt_ids, images)
        ids, start, end, fail_after = self._script(prompt_ids, params.max_tokens)
        live = self._version if version is None else version
        self._running[request_id] = me = object()  # a resubmission reuses the id while the old one is unclosed
        tps, loop = self.config.decode_tps, asyncio.get_running_loop()
        try:
            async with self._admitted():
                if tps > 0:
                    await asyncio.sleep(self._prefill_s(prompt_ids))
                t0, i = loop.time(), start
                while i < end:
                    if fail_after is not None and i >= fail_after:
                        raise EngineError(f"scripted engine failure after {i} tokens")
                    t0 += await self._pause_s()  # the clock stops while paused
                    if request_id in self._aborted:
                        self._aborted.discard(request_id)
                        yield TokenDelta([], [], self._version, "abort")
                        return
                    n = 1
                    if tps > 0:
                        n = start + int((loop.time() - t0) * tps) - i  # tokens due by now, not yet handed over
                        if n <= 0:
                            await asyncio.sleep((i - start + 1) / tps - (loop.time() - t0))
                            continue
                        n = min(n, end - i, (fail_after - i) if fail_after is not None else n)
                    elif self.config.token_delay_s:
                        await asyncio.sleep(self.config.token_delay_s)
                    if version is None and self.continues_in_place:
                        live = self._version
                    yield TokenDelta(ids[i : i + n], [0.0] * n, live, _finish(i + n, len(ids), end), prompt=expanded)
                    expanded = None
                    i += n
        finally:
            if self._running.get(request_id) is me:
                del self._running[request_id]
                self._aborted.discard(request_id)

    async def _prompt(
        self, prompt_ids: list[int], images: list[ImageInput] | None
    ) -> tuple[list[int], ExpandedPrompt | None]:
        """The prompt the model runs, and with images its expansion (each placeholder expanded by the processor);
        refused when closed, or when the prompt leaves no room in the context window."""
        if self.closed:
            raise EngineError("scripted engine is closed")
        expanded = None
        if images:
            if not self.takes_images:
                raise EngineError(f"the scripted engine serves {self.config.model}, which takes no images")
            expanded, _ = await asyncio.to_thread(
                expand_images, self.processor, self.image_token_id, list(prompt_ids), images
            )
            prompt_ids = expanded.prompt_ids
        if len(prompt_ids) >= self.max_model_len:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens does not fit the context window")
        return prompt_ids, expanded

    def _script(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], int, int, int | None]:
        """The ids of the turn this prompt is at, where to stream them from and to (a resubmitted prompt already ends
        with the first ones; at most `max_tokens`), and after how many to fail (the turn's `fail_after`, else None)."""
        index = min(self._turn_index(prompt_ids), len(self.turns) - 1)
        turn, ids = self.turns[index], self._ids(index, prompt_ids)
        fail_after = turn.get("fail_after") if isinstance(turn, dict) else None
        last = prompt_ids[-1] if prompt_ids else None
        start = next((j for j in range(len(ids) - 1, 0, -1) if ids[j - 1] == last and prompt_ids[-j:] == ids[:j]),
                     0)  # a resubmission: the prompt ends with the turn's first j ids  # fmt: skip
        return ids, start, min(len(ids), start + max_tokens), fail_after

    async def _pause_s(self) -> float:
        """Waits while paused; how long that was (0.0 when not paused)."""
        if self._paused.is_set():
            return 0.0
        loop = asyncio.get_running_loop()
        paused_at = loop.time()
        await self._paused.wait()
        return loop.time() - paused_at

    def loaded_versions(self) -> list[int]:
        return list(range(self._version + 1))

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    async def pause(self) -> None:
        self._paused.clear()

    async def resume(self) -> None:
        self._paused.set()

    async def publish(self, path: str, kind: Literal["lora", "full"], version: int | None = None) -> int:
        await asyncio.sleep(self.config.publish_delay_s)
        self._version = self._version + 1 if version is None else version
        self.last_publish_tier = "scripted"  # no weights travel
        return self._version

    async def close(self) -> None:
        """Like a real engine going away: running generations end with an abort, new ones fail until start()."""
        self.closed = True
        self._aborted |= set(self._running)
        self._paused.set()  # a paused generation wakes to see its abort
