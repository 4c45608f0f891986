"""The scripted engine: plays back assistant turns given as text or tool calls, as real sampled ids.

Each turn is rendered the way the model family writes it (Hermes `<tool_call>` JSON + the end-of-turn token)
and tokenized with the served model's tokenizer, then streamed token by token like any engine. It lets users
check a harness integration without a model, and lets tests drive real agent CLIs deterministically. The turn
played is chosen by how many assistant turns the prompt already holds, so concurrent sessions each get their
own script position.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from hrl.runners.engines.base import SamplingParams, TokenDelta
from hrl.runners.errors import EngineError
from hrl.runners.models import resolve_model

__all__ = ["ScriptedEngine", "ScriptedEngineConfig", "ScriptedTurn", "render_turn"]

# One assistant turn to play back: text, or {"text": …, "tool_calls": [{"name": …, "arguments": {…}}]}.
ScriptedTurn = str | dict[str, Any]


class ScriptedEngineConfig(BaseModel):
    model: str = Field(description="Model dir or id whose tokenizer renders the turns.")
    turns: list[ScriptedTurn] = Field(
        default_factory=lambda: ["Done."],
        description="Assistant turns: a string, or {'text': …, 'tool_calls': [{'name': …, 'arguments': {…}}]}, "
        "optionally with 'fail_after': N to die with an engine error after N tokens. Past the end, the last turn "
        "repeats.",
    )
    script_file: str | None = Field(None, description="JSON file with a list of turns (overrides `turns`).")
    token_delay_s: float = Field(0.0, description="Pause between streamed tokens, to mimic decoding time.")
    max_model_len: int = Field(32768, description="Context window in tokens.")
    publish_delay_s: float = Field(0.0, description="How long a publish takes (to test waiting through one).")
    continues_in_place: bool = Field(
        True, description="Publishes apply to running requests (False: like vLLM LoRA, the proxy must resubmit)."
    )


def render_turn(turn: str | dict[str, Any], end_of_turn: str) -> str:
    """The text a Hermes-style model would sample for a turn, ending with the end-of-turn token."""
    if isinstance(turn, str):
        return turn + end_of_turn
    parts = [turn["text"]] if turn.get("text") else []
    for call in turn.get("tool_calls", []):
        parts.append(
            f"<tool_call>\n{json.dumps({'name': call['name'], 'arguments': call.get('arguments', {})})}\n</tool_call>"
        )
    return "\n".join(parts) + end_of_turn


class ScriptedEngine:
    name = "scripted"

    def __init__(self, config: ScriptedEngineConfig) -> None:
        self.config = config
        self.max_model_len = config.max_model_len
        self._version = 0
        self._paused = asyncio.Event()
        self._paused.set()
        self._aborted: set[str] = set()
        self._running: dict[str, object] = {}  # request id -> the generation that serves it now
        self._closed = False
        self.tokenizer: Any = None
        self.turns = list(config.turns)
        self.continues_in_place = config.continues_in_place

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.config.model))
        if self.config.script_file:
            self.turns = json.loads(await asyncio.to_thread(Path(self.config.script_file).read_text))
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._end = (
            "<|im_end|>"
            if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id
            else self.tokenizer.eos_token
        )
        self._assistant = self.tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self._closed = False

    def _turn_index(self, prompt_ids: list[int]) -> int:
        a, n = self._assistant, 0
        for i in range(len(prompt_ids) - len(a) + 1):
            if prompt_ids[i : i + len(a)] == a:
                n += 1
        return max(0, n - 1)

    async def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, *, version: int | None = None
    ) -> AsyncIterator[TokenDelta]:
        if self._closed:
            raise EngineError("scripted engine is closed")
        if len(prompt_ids) >= self.max_model_len:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens does not fit the context window")
        turn = self.turns[min(self._turn_index(prompt_ids), len(self.turns) - 1)]
        ids = self.tokenizer.encode(render_turn(turn, self._end), add_special_tokens=False)
        fail_after = turn.get("fail_after") if isinstance(turn, dict) else None
        start = next((j for j in range(len(ids) - 1, 0, -1) if prompt_ids[-j:] == ids[:j]), 0)  # a resubmission
        live = self._version if version is None else version
        self._running[request_id] = me = object()  # a resubmission reuses the id while the old one is unclosed
        try:
            for i, tok in enumerate(ids[start : start + params.max_tokens], start):
                if fail_after is not None and i >= fail_after:
                    raise EngineError(f"scripted engine failure after {i} tokens")
                await self._paused.wait()
                if request_id in self._aborted:
                    self._aborted.discard(request_id)
                    yield TokenDelta([], [], self._version, "abort")
                    return
                if self.config.token_delay_s:
                    await asyncio.sleep(self.config.token_delay_s)
                finish: Literal["stop", "length"] | None = None
                if i == len(ids) - 1:
                    finish = "stop"
                elif i == start + params.max_tokens - 1:
                    finish = "length"
                if version is None and self.continues_in_place:
                    live = self._version
                yield TokenDelta([tok], [0.0], live, finish)
        finally:
            if self._running.get(request_id) is me:
                del self._running[request_id]
                self._aborted.discard(request_id)

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
        self._closed = True
        self._aborted |= set(self._running)
        self._paused.set()  # a paused generation wakes to see its abort
