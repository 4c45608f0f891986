"""Which baseline for online traces that come without a group: the batch's, or a running mean per task?

Simulated traffic through the code an online run uses (`lone_advantages`, `TaskBaseline`): each step takes B lone
traces of tasks drawn from a pool of T, each task with its own success rate p (spread over [0, 1]) that grows a
little every step, as a policy that learns. The ideal advantage of a trace is r − p (its task's true value); a
baseline is better the more its advantages correlate with that, because what remains is the task's difficulty
leaking into the gradient. Printed: the mean correlation with r − p per (T, baseline), and the share of traces
that had a baseline of their own.

    python bench/online_baseline.py                  # a few seconds, no model
    python bench/online_baseline.py --batch 32 --steps 400
"""

from __future__ import annotations

import argparse
import math
import random

from hrl.train.advantages import lone_advantages
from hrl.train.online import TaskBaseline


def _corr(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sx, sy = math.sqrt(sum((x - mx) ** 2 for x in xs)), math.sqrt(sum((y - my) ** 2 for y in ys))
    return sxy / (sx * sy) if sx and sy else 0.0


def simulate(tasks: int, baseline: str, batch: int, steps: int, seed: int) -> tuple[float, float]:
    """Mean correlation of the advantages with r − p over the steps, and the share of task-baselined traces."""
    rng = random.Random(seed)
    p = {f"t{i}": rng.random() * 0.8 for i in range(tasks)}
    running = TaskBaseline() if baseline == "task" else None
    corrs, own, n = [], 0, 0
    for step in range(steps):
        traces = []
        for k in range(batch):
            tid = rng.choice(list(p))
            r = float(rng.random() < p[tid])
            traces.append({"trace_id": f"{step}-{k}", "task_id": tid, "reward": r, "p": p[tid]})
        rewards = {t["trace_id"]: t["reward"] for t in traces}
        groups = {t["trace_id"]: t["trace_id"] for t in traces}  # every trace alone: no group
        own_baselines = running.of(traces) if running else None
        adv, metrics = lone_advantages(rewards, groups, "grpo", own_baselines or None)
        if running:
            running.observe(traces)
        own, n = own + int(metrics["adv/task_baselined"]), n + len(traces)
        ideal = [t["reward"] - t["p"] for t in traces]
        corrs.append(_corr([adv[t["trace_id"]] for t in traces], ideal))
        for tid in p:  # the policy learns: every task a little easier
            p[tid] = min(1.0, p[tid] + 0.002)
    return sum(corrs) / len(corrs), own / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    print(f"batch {a.batch}, {a.steps} steps, {a.seeds} seeds: corr(advantage, r - p), higher is better")
    print(f"{'tasks':>6}  {'batch':>7}  {'task':>7}  {'task-baselined':>15}")
    for tasks in (4, 16, 64, 256, 4096):
        row = {}
        for kind in ("batch", "task"):
            runs = [simulate(tasks, kind, a.batch, a.steps, s) for s in range(a.seeds)]
            row[kind] = (sum(c for c, _ in runs) / len(runs), sum(o for _, o in runs) / len(runs))
        print(f"{tasks:>6}  {row['batch'][0]:>7.3f}  {row['task'][0]:>7.3f}  {row['task'][1]:>15.2f}")


if __name__ == "__main__":
    main()
