"""Which tasks a batch trains on: `uniform`; `signal` — tasks weighted by the chance that their group carries a
gradient; or `balanced` — the families of `train.sampler_key` taken in turn, so each gets the same share.

A GRPO group of G episodes teaches nothing when its rewards all agree. With p the task's success rate, the chance
that a group of G independent episodes holds both a success and a failure is 1 − p^G − (1 − p)^G: 0 for a task
always or never solved, largest at p = ½. `signal` samples tasks in proportion to it.

p is the posterior mean of a Beta(1, 1) prior updated by the task's committed traces, (successes + 1) / (episodes
+ 2) (Laplace's rule): a task never seen has p = ½, the largest weight, so every task is tried; and no estimate
reaches 0 or 1, so a task solved (or failed) every time so far keeps a small weight and is revisited as the policy
moves. A success is a reward ≥ `train.success_reward` (default 1: the binary verifier's pass, every listed test
passing for the partial one); traces without a reward (infrastructure failures, cut-short episodes) do not count.

With many tasks, each is drawn too rarely for its own count to leave the prior (the CPU demo: 240 tasks, 4 a step).
`train.sampler_key` names a task field (a dotted path: `repo` for SWE-bench, `demo.op` for the demo's operator
families) whose tasks share one count: a family's rate is learned within a few steps and steers every task in it.

The counts come from the traces the run has already written, so a resumed run rebuilds them from its committed
steps and picks what an uninterrupted run would have.

`balanced` needs a key. It walks the key's values (its strata) in rounds: each round is a fresh shuffle of all of
them, and each group takes the next stratum and one of its tasks at random. A stratum's share of groups is then
1 / strata whatever its size; a batch holds different strata where their number is a multiple of the batch's
groups (8 operators, 2 or 4 groups), else a round's end may meet the next round's start in one batch. Uniform
sampling lets one batch's luck decide which family is trained. Where what a policy learns from one family spills into another, that
matters: the demo's policy learnt "write `+`" from a run whose rewards came mostly from `-` bugs, and then wrote `+`
back over `+` bugs too. Tasks without the field form one stratum. Picks depend only on (seed, group number), so a
resumed run, sync or async, draws what an uninterrupted one would have.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from hrl.config.train import SamplerKind
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.trace import is_infra_failure

__all__ = ["SamplerKind", "Strata", "TaskStats", "entropy", "signal_weight", "task_field", "weighted_sample"]


def signal_weight(p: float, group_size: int) -> float:
    """The chance that a group of `group_size` episodes of success rate `p` has rewards that are not all equal."""
    return max(0.0, 1.0 - p**group_size - (1.0 - p) ** group_size)


def task_id(task: Any) -> str:
    """A task's id as episodes and traces carry it (see `Episode.task_id`)."""
    return Episode(task, 0, 0).task_id


def task_field(task: Any, path: str) -> str | None:
    """The value at a dotted `path` of a task (dict or model), as text; None where the task has none."""
    value: Any = task if isinstance(task, dict) else task.model_dump()
    for part in path.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return None
        value = value[part]
    return str(value)


class TaskStats:
    """Episode and success counts from traces, per task or per family of tasks (`key`: a task field shared by a
    family; tasks without it count alone); success rates under a Beta(1, 1) prior."""

    def __init__(self, success_reward: float = 1.0, tasks: Sequence[Any] = (), key: str = "") -> None:
        self.success_reward = success_reward
        self.episodes: Counter[str] = Counter()
        self.successes: Counter[str] = Counter()
        self.family: dict[str, str] = {}  # task id → the family whose counts it shares
        if key:
            for t in tasks:
                if (value := task_field(t, key)) is not None:
                    self.family[task_id(t)] = f"{key}={value}"

    def observe(self, traces: Iterable[dict[str, Any]]) -> None:
        for t in traces:
            if t.get("reward") is None or is_infra_failure(t) or t.get("task_id") is None:
                continue
            k = self._count_key(str(t["task_id"]))
            self.episodes[k] += 1
            self.successes[k] += float(t["reward"]) >= self.success_reward

    def _count_key(self, tid: str) -> str:
        return self.family.get(tid, tid)

    def rate(self, tid: str) -> float:
        k = self._count_key(tid)
        return (self.successes[k] + 1) / (self.episodes[k] + 2)

    def weights(self, tasks: Sequence[Any], group_size: int) -> list[float]:
        """Signal weights of `tasks`; all equal when none could carry signal (group_size 1)."""
        w = [signal_weight(self.rate(task_id(t)), group_size) for t in tasks]
        return w if any(w) else [1.0] * len(tasks)


class Strata:
    """Tasks grouped by the value of a task field (`key`), for `balanced` sampling."""

    def __init__(self, tasks: Sequence[Any], key: str) -> None:
        self.members: dict[str, list[Any]] = {}
        for t in tasks:
            self.members.setdefault(task_field(t, key) or "", []).append(t)
        self.values = sorted(self.members)

    def pick(self, seed: int, group: int, taken: Iterable[str] = ()) -> Any:
        """The task of the run's group number `group`: the next stratum of its round, then one of the stratum's tasks
        not in `taken` (task ids) where there is one."""
        rnd, i = divmod(group, len(self.values))
        order = list(self.values)
        random.Random(f"{seed}:round:{rnd}").shuffle(order)
        members = self.members[order[i]]
        taken = set(taken)
        free = [t for t in members if task_id(t) not in taken] or members
        return random.Random(f"{seed}:group:{group}").choice(free)


def weighted_sample(items: Sequence[Any], weights: Sequence[float], k: int, rng: random.Random) -> list[Any]:
    """k distinct items, each next one drawn with probability ∝ its weight among those left (Efraimidis–Spirakis:
    the k largest u^(1/w), compared as log(u)/w). Items of weight 0 come only after every positive one."""
    keys = []
    for i, w in enumerate(weights):
        u = rng.random() or 5e-324
        keys.append((math.log(u) / w if w > 0 else -math.inf, -i))
    order = sorted(range(len(items)), key=lambda i: keys[i], reverse=True)
    return [items[i] for i in order[: min(k, len(items))]]


def entropy(weights: Sequence[float]) -> float:
    """Entropy of the normalised weights ÷ log(n): 1 for uniform sampling, towards 0 as few tasks take it all."""
    total = sum(weights)
    if len(weights) < 2 or total <= 0:
        return 1.0
    ps = [w / total for w in weights if w > 0]
    return -sum(p * math.log(p) for p in ps) / math.log(len(weights))
