"""The uncertainty of an evaluation's rates: Wilson intervals, pass@k, and how often two harnesses agree.

Pure functions over counts, so a table's every figure can be checked by hand (tests/runners/report/test_stats.py).
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any

__all__ = ["Z95", "agreement", "pass_at_k", "succeeded", "wilson"]

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95 % interval


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial rate `successes / n` (Wilson 1927; Brown, Cai & DasGupta 2001):

        centre ± half = (p + z²/2n ± z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n)

    Unlike p ± z·√(p(1−p)/n) it stays inside [0, 1] and is not zero-width at 0/n or n/n, which is where small
    evaluations live (0/10 → [0, 0.278]). None for n = 0: no episode, no rate."""
    if n == 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p, z2 = successes / n, z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of one task, c of them correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code"): 1 − C(n−c, k) / C(n, k), the chance that k of the n drawn without
    replacement hold at least one success. Needs k ≤ n."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} from {c} correct of {n} samples (needs 0 < k ≤ n, 0 ≤ c ≤ n)")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def agreement(solved: dict[str, dict[str, bool]]) -> dict[tuple[str, str], tuple[int, int]]:
    """{(harness a, harness b): (tasks on which both agree, tasks both have)} for every pair, in the given order;
    `solved` is {harness: {task: solved?}}. Only tasks both harnesses have a verdict on are compared."""
    out = {}
    for a, b in combinations(solved, 2):
        shared = solved[a].keys() & solved[b].keys()
        out[(a, b)] = (sum(solved[a][t] == solved[b][t] for t in shared), len(shared))
    return out


def succeeded(trace: dict[str, Any], success_reward: float = 1.0) -> bool:
    """Whether an episode solved its task: the trace's `success` (the task's own rule, apart from a shaped reward)
    where the verifier said it, else (null, or a trace written before the key existed) reward ≥ `success_reward`;
    an episode without a reward is no success."""
    if isinstance(trace.get("success"), bool):
        return bool(trace["success"])
    return trace.get("reward") is not None and float(trace["reward"]) >= success_reward
