"""A simulated agent: multi-turn chat through the real proxy with tool/think pauses, for loop and load tests.

Each episode opens a proxy session, asks for a number of turns drawn from [min_turns, max_turns], sleeps a
lognormal "tool time" between turns (heavy-tailed, like real agents), and ends with a reward computed from what
the model said (by default the share of the letter 'e' — any policy can move it). No sandbox, no CLI: it is for
measuring the training loop and the proxy, not for judging an agent.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from hrl.runners.rollouts.episodes import Episode, Rollouts
from hrl.runners.trace import write_trace

__all__ = ["SimulatedAgent", "letter_reward"]


def letter_reward(text: str, letter: str = "e") -> float:
    return text.count(letter) / max(len(text), 1)


class SimulatedAgent(Rollouts):
    """Implements the loop's `Rollouts` protocol (`episode(ep, trace_file) -> trace`) against a `Proxy`."""

    def __init__(
        self,
        proxy: Any,
        url: str,
        *,
        seed: int = 0,
        min_turns: int = 1,
        max_turns: int = 1,
        tool_time_median_s: float = 0.0,
        tool_time_sigma: float = 1.0,
        max_tokens: int = 12,
        reward: Callable[[str], float] = letter_reward,
        between_turns: Callable[[Any, int], Awaitable[None]] | None = None,
    ) -> None:
        """`between_turns(ep, turn)`: awaited after each turn's tool pause (a test holding an episode open across
        a weight publish, say)."""
        self.proxy, self.url, self.rng = proxy, url, random.Random(seed)
        self.between_turns = between_turns
        self.min_turns, self.max_turns = min_turns, max_turns
        self.mu, self.sigma = math.log(tool_time_median_s) if tool_time_median_s > 0 else None, tool_time_sigma
        self.max_tokens, self.reward = max_tokens, reward
        self.http: aiohttp.ClientSession | None = None

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        meta = {"task_id": ep.task_id, "group_id": ep.group_id, "metadata": {"episode": ep.key}}
        token = self.proxy.open_session(meta=meta, version=ep.version).token
        turns = self.rng.randint(self.min_turns, self.max_turns)
        pauses = [self.rng.lognormvariate(self.mu, self.sigma) if self.mu is not None else 0.0 for _ in range(turns)]
        msgs: list[dict[str, Any]] = [{"role": "user", "content": str(ep.task.get("problem_statement", "go"))}]
        text = ""
        try:
            for turn in range(turns):
                body = {"messages": msgs, "max_tokens": self.max_tokens}
                async with self.http.post(f"{self.url}/s/{token}/v1/chat/completions", json=body) as r:
                    data = await r.json()
                if r.status != 200:
                    raise RuntimeError(data.get("error", {}).get("message", str(r.status)))
                text = data["choices"][0]["message"]["content"] or ""
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"result {turn}"}]
                await asyncio.sleep(pauses[turn])
                if self.between_turns is not None and turn < turns - 1:
                    await self.between_turns(ep, turn)
        except asyncio.CancelledError:
            self._end(token, trace_file, failure_reason="cancelled")
            raise
        except Exception as e:
            return self._end(token, trace_file, failure_reason="engine_error", extra={"error": str(e)[:500]})
        return self._end(token, trace_file, reward=self.reward(text))

    def _end(self, token: str, trace_file: Path, **outcome: Any) -> dict[str, Any]:
        trace = self.proxy.end_session(token, **outcome)
        write_trace(trace_file, trace, self.export)
        return trace

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
