"""Tinker sampling sessions over hrl's engine: a sampler is a LoRA adapter published to the engine as a policy
version (the base model is version 0), and each sample is generated pinned to that version, with the engine's own
logprobs, then recorded as one `hrl.trace/1` trace per sampled sequence in `<run>/traces/iter-<version>.jsonl`, token
for token as the engine produced it (`hrl inspect RUN_DIR` reads them).

The engine keeps a few LoRA versions loaded; a sampler whose version it let go is published again before it samples."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinker import types

from hrl.runners.engines import Engine, SamplingParams
from hrl.runners.errors import ClientError
from hrl.runners.tinker.wire import Sequenced
from hrl.runners.trace import SCHEMA, TraceWriter, add_version

__all__ = ["Sampler", "Samplers"]


@dataclass
class Sampler:
    sampler_id: str
    owner: str
    model_path: str | None  # the tinker:// path of its adapter; None: the base model
    adapter: Path | None
    version: int  # the engine's policy version it samples


class Samplers:
    """The sampling sessions of one engine; traces go to `trace_file(version)`."""

    def __init__(
        self, engine: Engine, name: str, trace_file: Callable[[int], Path], decode: Callable[[list[int]], str]
    ):
        self.engine, self.name, self.trace_file, self.decode = engine, name, trace_file, decode
        self.samplers: dict[str, Sampler] = {}
        self._publish = asyncio.Lock()  # versions grow one publish at a time
        self._writers: dict[Path, TraceWriter] = {}

    async def open(self, owner: str, sampler_id: str, model_path: str | None, adapter: Path | None) -> Sampler:
        """A sampler of `adapter` (published now) or of the base model."""
        version = 0 if adapter is None else await self._published(adapter)
        sampler = self.samplers[sampler_id] = Sampler(sampler_id, owner, model_path, adapter, version)
        return sampler

    def get(self, owner: str, sampler_id: str) -> Sampler:
        sampler = self.samplers.get(sampler_id)
        if sampler is None or sampler.owner != owner:
            raise ClientError(404, f"no sampling session {sampler_id} (unknown, or another key's)")
        return sampler

    async def _published(self, adapter: Path) -> int:
        async with self._publish:
            return await self.engine.publish(str(adapter), "lora")

    async def prompt_logprobs(self, sampler: Sampler, prompt: list[int], last_n: int | None) -> list[float]:
        """The sampler's logprobs of each prompt token after the ones before it (NaN for the first, and before the
        last `last_n`): the engine scores with its live version, so the sampler's adapter is made live first."""
        if not self.engine.scores:
            raise ClientError(400, f"prompt logprobs: the {self.engine.name} engine scores nothing")
        async with self._publish:
            if sampler.version != self.engine.version:
                if sampler.adapter is None:
                    raise ClientError(400, "prompt logprobs of the base model once a LoRA was published: not "
                                           "supported (the engine scores with its live weights)")  # fmt: skip
                sampler.version = await self.engine.publish(str(sampler.adapter), "lora")
            scored = await self.engine.score(prompt[:1], prompt[1:]) if len(prompt) > 1 else []
        out = [math.nan, *scored]
        return [math.nan] * (len(out) - last_n) + out[-last_n:] if last_n else out

    async def sample(self, sampler: Sampler, request: types.SampleRequest, group: str) -> list[Sequenced]:
        """`request.num_samples` sequences from `sampler`, each recorded as a trace of group `group` (the request),
        sequence `<group>:<i>`."""
        if sampler.version not in self.engine.loaded_versions() and sampler.adapter is not None:
            sampler.version = await self._published(sampler.adapter)
        prompt = request.prompt.to_ints()
        runs = [self._one(sampler, prompt, _params(request.sampling_params, len(prompt), self.engine.max_model_len, i),
                          _stop_strings(request.sampling_params), f"{group}:{i}:{uuid.uuid4().hex[:8]}")
                for i in range(request.num_samples)]  # fmt: skip
        done = await asyncio.gather(*runs)
        await asyncio.to_thread(self._record, sampler, done, group)
        return [seq for seq, _ in done]

    async def _one(
        self, sampler: Sampler, prompt: list[int], params: SamplingParams, stops: list[str], rid: str
    ) -> tuple[Sequenced, dict[str, Any]]:
        started, first, tokens, logprobs, versions = time.time(), 0.0, [], [], []  # type: ignore[var-annotated]
        finish = "stop"
        async for delta in self.engine.generate(rid, prompt, params, version=sampler.version):
            first = first or time.time()
            add_version(versions, len(tokens), delta.version, len(delta.token_ids))
            tokens += delta.token_ids
            logprobs += delta.logprobs
            finish = "length" if delta.finish_reason == "length" else "stop"
            if stops and any(s in self.decode(tokens) for s in stops):
                await self.engine.abort(rid)
                finish = "stop"
                break
        call = {"call_id": "c1", "dialect": "tinker", "stream": False, "side": False, "started_at": 0.0,
                "first_token_at": round((first or started) - started, 3), "ended_at": round(time.time() - started, 3),
                "prompt_ids": prompt, "response_ids": tokens, "response_logprobs": logprobs, "versions": versions,
                "finish_reason": finish, "started": started}  # fmt: skip
        return Sequenced(tokens, logprobs, finish), call

    def _record(self, sampler: Sampler, done: list[tuple[Sequenced, dict[str, Any]]], group: str) -> None:
        path = self.trace_file(sampler.version)
        writer = self._writers.setdefault(path, TraceWriter(path))
        for i, (_, call) in enumerate(done):
            started = call.pop("started")
            writer.write({
                "schema": SCHEMA, "trace_id": uuid.uuid4().hex, "session": sampler.sampler_id, "task_id": None,
                "group_id": group, "agent": {"name": "tinker"}, "env": {},
                "model": {"name": self.name, "path": sampler.model_path}, "status": "ok", "failure_reason": None,
                "reward": None, "reward_info": {}, "started_at": round(started, 3),
                "ended_at": round(started + call["ended_at"], 3), "calls": [call], "tools": [],
                "metadata": {"tinker": {"sequence_id": f"{group}:{i}", "client": sampler.owner}},
            })  # fmt: skip


def _params(p: types.SamplingParams, prompt_len: int, window: int, i: int) -> SamplingParams:
    """The engine's sampling parameters for sample `i`: no max_tokens = the rest of the context window; `stop=[]`
    (no stop at all, EOS included) = ignore_eos; token-id stops stop after that token."""
    if prompt_len >= window:
        raise ClientError(400, f"prompt of {prompt_len} tokens does not fit the context window of {window}")
    stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
    return SamplingParams(
        max_tokens=min(p.max_tokens or window, window - prompt_len),
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=max(p.top_k, 0),
        seed=None if p.seed is None else p.seed + i,
        stop_token_ids=tuple(s for s in stop if isinstance(s, int)),
        ignore_eos=p.stop is not None and not stop,
    )


def _stop_strings(p: types.SamplingParams) -> list[str]:
    stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
    return [s for s in stop if isinstance(s, str)]
