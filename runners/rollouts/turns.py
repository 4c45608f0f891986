"""Turn scores (`train.credit: turn`): the verifier scores the episode's sandbox as each LLM call arrives.

The sandbox is quiescent while the agent waits for its model, so a call's arrival is "the state after the previous
turn's tools". `TurnScorer.arrived` is the proxy session's `on_call` hook: it reads the state there and then (the
verifier's `turn_state`, e.g. the agent's diff: quick, changing nothing) and leaves its scoring (`turn_score`, e.g.
the tests run in a fresh grading sandbox) to run beside the generation and the agent's next tools, one at a time per
episode; a state already scored is not scored again. `settle` waits for them before the trace is written. A score
that fails or runs past its limit is recorded as null on its call and counted, never failing the episode.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hrl.runners.proxy.call import CallRecord
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.verifier import Verdict, Verifier
from hrl.sandboxes import Sandbox

__all__ = ["TurnScorer"]


class TurnScorer:
    """One episode's turn scores: `arrived` per call, `settle` once the agent has ended, `summary` for its trace."""

    def __init__(self, verifier: Verifier, sandbox: Sandbox, task: Task, timeout_s: float) -> None:
        self.verifier, self.sandbox, self.task, self.timeout_s = verifier, sandbox, task, timeout_s
        self._scores: dict[str, asyncio.Task[float | None]] = {}  # by state: each state scored once
        self._pending: list[asyncio.Task[None]] = []
        self._one_at_a_time = asyncio.Lock()
        self.failed = 0  # calls whose score is null
        self.busy_s = 0.0  # time spent scoring (reading states and grading them)

    async def arrived(self, call: CallRecord) -> None:
        """The proxy's hook: the state read now, its score recorded on `call` when had."""
        call.turn_scored = True
        t0 = time.monotonic()
        try:
            state = await asyncio.wait_for(self.verifier.turn_state(self.sandbox, self.task), self.timeout_s)
        except Exception:  # a state that cannot be read is a null score, never the episode's failure
            state = None
        finally:
            self.busy_s += time.monotonic() - t0
        if state is None:
            self.failed += 1
            return
        if state not in self._scores:
            self._scores[state] = asyncio.create_task(self._score(state))
        self._pending.append(asyncio.create_task(self._record(call, self._scores[state])))

    async def _score(self, state: str) -> float | None:
        async with self._one_at_a_time:
            t0 = time.monotonic()
            try:
                return await asyncio.wait_for(self.verifier.turn_score(self.task, state), self.timeout_s)
            except Exception:
                return None
            finally:
                self.busy_s += time.monotonic() - t0

    async def _record(self, call: CallRecord, score: asyncio.Task[float | None]) -> None:
        call.turn_score = await asyncio.shield(score)
        self.failed += call.turn_score is None

    async def settle(self) -> None:
        """Wait for the scores still being had (each bounded by the time limit)."""
        await asyncio.gather(*self._pending, return_exceptions=True)

    def cancel(self) -> None:
        for task in [*self._scores.values(), *self._pending]:
            task.cancel()

    def summary(self, verdict: Verdict) -> dict[str, Any]:
        """The trace's `metadata.turn_scores`: `final` (the verifier's `end_score` of the final verdict: the state
        after the last turn), `states` graded, `failed` calls (null scores), `score_s` spent scoring."""
        return {"final": self.verifier.end_score(verdict), "states": len(self._scores), "failed": self.failed,
                "score_s": round(self.busy_s, 3)}  # fmt: skip
