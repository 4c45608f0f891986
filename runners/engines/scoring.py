"""A running vLLM server as a scorer: the logprob of every token of a sequence given its prefix (`prompt_logprobs`),
over HTTP. On-policy distillation's teacher behind a URL (`distill.teacher: http://…` or `unix:/…`) scores the
student's samples with it, and `hrl train` checks the server's tokenizer against the student's with its
`/tokenize` route before anything starts.

A URL is the server's root or its OpenAI base (`…/v1`); `unix:/path/to/socket` reaches a server listening on a
unix socket, as the vLLM engine's own does."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from hrl.runners.engines.vllm_server import score_body, scored_logprobs, server_address
from hrl.runners.errors import EngineError

__all__ = ["ScoringServer"]


class ScoringServer:
    """The scoring routes of the vLLM server at `url`, for `model` ('' = its one base model)."""

    def __init__(self, url: str, model: str = "", concurrency: int = 8, timeout_s: float = 600) -> None:
        base, self.unix = server_address(url)
        self.url, self.base = url, base.removesuffix("/v1")
        self.model, self.concurrency, self.timeout_s = model, concurrency, timeout_s
        self.max_model_len = 0

    def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.UnixConnector(path=self.unix) if self.unix else aiohttp.TCPConnector(limit=self.concurrency)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def _json(self, http: aiohttp.ClientSession, method: str, route: str, body: Any = None) -> Any:
        try:
            async with http.request(method, f"{self.base}{route}", json=body) as resp:
                if resp.status != 200:
                    raise EngineError(f"{method} {self.url} {route}: HTTP {resp.status}: {(await resp.text())[:300]}")
                return await resp.json()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineError(f"the scoring server at {self.url} did not answer {route}: {e}") from e

    async def _resolve(self, http: aiohttp.ClientSession) -> None:
        """The served model (`model`, or the one base model served) and its context window."""
        bases = {m["id"]: m for m in (await self._json(http, "GET", "/v1/models"))["data"] if not m.get("parent")}
        if self.model and self.model not in bases:
            raise EngineError(f"the server at {self.url} does not serve {self.model!r} (it serves {sorted(bases)})")
        if not self.model:
            if len(bases) != 1:
                raise EngineError(f"the server at {self.url} serves {len(bases)} base models ({sorted(bases)}): "
                                  "name the one that scores")  # fmt: skip
            self.model = next(iter(bases))
        self.max_model_len = int(bases[self.model].get("max_model_len") or 0)

    def describe(self, texts: list[str]) -> list[list[int]]:
        """Resolve the served model and return how its tokenizer splits each of `texts` (no special tokens added)."""

        async def go() -> list[list[int]]:
            async with self._session() as http:
                await self._resolve(http)
                bodies = [{"model": self.model, "prompt": t, "add_special_tokens": False} for t in texts]
                return [list((await self._json(http, "POST", "/tokenize", b))["tokens"]) for b in bodies]

        return asyncio.run(go())

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Per sequence, per position t ≥ 1: log p(ids[t] | ids[:t]) under the served model; 0.0 at t = 0 (no prefix).
        At most `concurrency` requests in flight. Runs its own event loop: call it from a thread without one."""

        async def go() -> list[list[float]]:
            gate = asyncio.Semaphore(self.concurrency)
            async with self._session() as http:
                if not self.max_model_len:
                    await self._resolve(http)

                async def one(ids: list[int]) -> list[float]:
                    if self.max_model_len and len(ids) + 1 > self.max_model_len:
                        raise EngineError(f"a sample of {len(ids)} tokens does not fit the scoring server's context "
                                          f"window of {self.max_model_len} (one more token is sampled)")  # fmt: skip
                    async with gate:
                        out = await self._json(http, "POST", "/v1/completions", score_body(self.model, ids))
                    return [0.0, *scored_logprobs(out, 1, ids[1:])]

                return list(await asyncio.gather(*(one(ids) for ids in sequences)))

        return asyncio.run(go())
