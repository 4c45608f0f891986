"""Held-out evaluation inside a training run: the policy of step k on tasks it never trains on.

With `eval_tasks` in the recipe, `hrl train` evaluates them all before the first update (step 0) and after the last
(step `train.iterations`), and every `train.eval_every` steps on the first `train.eval_slice` of them in between.
Each evaluation runs `train.eval_episodes` episodes per task through the same harness, sandbox and verifier as
training, writes their traces to `eval/step-NNNN.jsonl` in the run directory (apart from the training traces: they
never reach a batch, the task sampler or a resume's bookkeeping), and logs one metrics.jsonl row of its own:

- `eval/success`   share of successful episodes: the trace's `success` (the task's own rule, apart from a shaped
                   reward) where the verifier said it, else reward ≥ `train.success_reward` (`succeeded`)
- `eval/reward`    mean reward, an episode without one counted as 0
- `eval/turns`     mean agent turns
- `eval/episodes`, `eval/tasks`, `eval/failed` (episodes with a failure_reason), `eval/version` (the policy: every
  token of every episode of the evaluation is sampled by it, `Episode.version`)
- with `train.eval_markers` ({name: text}): `eval/has/<name>`, the share of episodes whose sampled text (every
  call's response ids, decoded) contains the text, and `eval/success_given/<name>`, the success rate among them

A step's evaluation happens before that step's rollouts, with the policy those rollouts use, so `eval/success` at
step k and `trace/reward` at step k describe the same weights. In an `--async` run (`train.async_loop`) the
evaluation of step k runs beside the training rollouts while step k trains and publishes: its episodes' sessions
are opened pinned to version k, so no eval episode mixes versions (LoRA publishes keep that adapter loaded beside
the new one; a full-weight publish waits for the evaluation to end). A resume runs again an evaluation whose row
was not logged (its partial trace file is replaced).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from hrl.runners.metrics import TURNS, trace_metrics
from hrl.runners.report.stats import succeeded
from hrl.runners.rollouts.episodes import Episode, Rollouts, harness_for, run_episodes
from hrl.runners.rundir import RunDir

__all__ = ["EvalEpisode", "Evaluations", "eval_row", "eval_steps", "evaluate", "succeeded"]


class EvalEpisode(Episode):
    """An episode of an evaluation: its group id says so (`eval<step>:<task>`), so no training group can take it."""

    @property
    def group_id(self) -> str:
        return f"eval{self.iteration}:{self.task_id}" + (f"@{self.agent}" if self.agent else "")


def eval_steps(iterations: int, every: int) -> dict[int, bool]:
    """{step: whole set?}: steps 0 and `iterations` on every task, and each `every`-th step between on the slice."""
    steps = dict.fromkeys(range(every, iterations, every), False) if every > 0 else {}
    return steps | {0: True, iterations: True}


def _marker_rows(wins: list[bool], texts: list[str], markers: dict[str, str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, text in markers.items():
        hits = [w for w, said in zip(wins, texts, strict=True) if text in said]
        out[f"eval/has/{name}"] = len(hits) / len(texts) if texts else None
        out[f"eval/success_given/{name}"] = sum(hits) / len(hits) if hits else None
    return out


def sampled_text(trace: dict[str, Any], decode: Callable[[list[int]], str]) -> str:
    """Everything the policy sampled in an episode, decoded call by call."""
    return "".join(decode(c["response_ids"]) for c in trace.get("calls") or [])


def eval_row(
    step: int,
    version: int,
    traces: list[dict[str, Any]],
    tasks: int,
    success_reward: float,
    markers: dict[str, str] | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> dict:
    """The metrics.jsonl row of one evaluation (see the module docstring); `markers` need `decode`."""
    n = len(traces)
    rewards = [float(t["reward"]) if t.get("reward") is not None else 0.0 for t in traces]
    wins = [succeeded(t, success_reward) for t in traces]
    turns = [trace_metrics(t)[TURNS] for t in traces]
    marks = {}
    if markers and decode is not None:
        texts = [sampled_text(t, decode) for t in traces]
        marks = _marker_rows(wins, texts, markers)
    return marks | {
        "step": step,
        "eval/success": sum(wins) / n if n else None,
        "eval/reward": sum(rewards) / n if n else None,
        "eval/turns": sum(turns) / n if n else None,
        "eval/episodes": float(n),
        "eval/tasks": float(tasks),
        "eval/failed": float(sum(bool(t.get("failure_reason")) for t in traces)),
        "eval/version": float(version),
    }


async def evaluate(
    tasks: list[dict[str, Any]], rollouts: Rollouts, run: RunDir, step: int, version: int, cfg: Any, whole: bool
) -> dict[str, Any]:
    """Run one evaluation of policy `version` and return its row; `whole`: every task, else the slice. Every
    episode's session is pinned to `version`, so a publish during the evaluation never reaches it.
    `cfg` is the loop's config (eval_episodes, eval_slice, eval_markers, concurrency, success_reward, seed)."""
    picked = tasks if whole else random.Random(cfg.seed).sample(tasks, min(cfg.eval_slice, len(tasks)))
    episodes = [
        EvalEpisode(t, k, step, harness_for(rollouts, j), version)
        for j, t in enumerate(picked)
        for k in range(cfg.eval_episodes)
    ]
    path = run.eval_trace_file(step)
    path.unlink(missing_ok=True)  # an evaluation cut short by a stop: its row was never logged; it runs again whole
    path.parent.mkdir(parents=True, exist_ok=True)
    traces = await run_episodes(rollouts, episodes, path, cfg.concurrency)
    decode = _decoder(cfg.trainer.model) if cfg.eval_markers else None
    return eval_row(step, version, list(traces), len(picked), cfg.success_reward, cfg.eval_markers, decode)


@functools.cache
def _decoder(model: str) -> Callable[[list[int]], str]:
    from transformers import AutoTokenizer

    from hrl.runners.models import split_adapter

    tok = AutoTokenizer.from_pretrained(split_adapter(model)[0])
    return lambda ids: str(tok.decode(ids, skip_special_tokens=False))


class Evaluations:
    """The run's evaluation schedule (`eval_steps`), minus what metrics.jsonl already holds (a resume)."""

    def __init__(self, tasks: list[dict[str, Any]] | None, cfg: Any, run: RunDir, rollouts: Rollouts) -> None:
        self.tasks, self.cfg, self.run, self.rollouts = tasks or [], cfg, run, rollouts
        self.steps = eval_steps(cfg.iterations, cfg.eval_every) if self.tasks else {}
        self.done = set(run.eval_rows())

    def due(self, step: int) -> bool:
        return step in self.steps and step not in self.done

    def _tasks_at(self, step: int) -> int:
        return len(self.tasks) if self.steps[step] else min(self.cfg.eval_slice, len(self.tasks))

    def episodes_at(self, step: int) -> int:
        """The episodes the evaluation at `step` runs (0 where none is due)."""
        return self._tasks_at(step) * self.cfg.eval_episodes if self.due(step) else 0

    async def at(self, step: int, version: int, sink: Any, on_event: Any) -> dict[str, Any] | None:
        """Evaluate policy `version` if `step` is due and not logged yet; log and return its row."""
        if not self.due(step):
            return None
        whole, n = self.steps[step], self._tasks_at(step)
        on_event("eval_start", {"step": step, "version": version, "tasks": n, "episodes": n * self.cfg.eval_episodes})
        row = await evaluate(self.tasks, self.rollouts, self.run, step, version, self.cfg, whole)
        sink.log(row, step=step)
        self.done.add(step)
        on_event("eval", row)
        return row
