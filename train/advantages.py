"""Per-trace advantages, computed once per trace and broadcast to all its branch samples.

Group = the traces of one task (`group_id`) in one batch. Variants:
- "grpo":    (r - mean_group) / (std_group + eps)       — Shao et al. 2024, DeepSeekMath (GRPO)
- "mean":    r - mean_group                              — GRPO without std normalisation; the loss keeps the
             trainer's `loss_norm` (by default a token mean per trace)
- "dr_grpo": r - mean_group AND the loss summed over tokens ÷ a constant (`trainer.max_len` × traces), not by
             length — Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO), which removes both
             biases. The advantages are those of "mean"; `LoopConfig` sets `trainer.loss_norm: constant` for it
             and rejects an explicit `loss_norm: trace`.
- "batch":   (r - mean_batch) / (std_batch + eps), one baseline over every trace of the batch — the global
             normalisation of REINFORCE++ (Hu 2025). A group whose episodes all failed is pushed down whenever another
             group of the batch succeeded; under a group baseline it teaches nothing. The CPU demo needs that: its
             policy learnt from rewarded `-` bugs to write `+`, wrote `+` back over `+` bugs, and those groups all
             failed, so GRPO never saw the mistake. Noisier than a group baseline (the task's difficulty is in it).
- "distill": 0 for every trace: the signal is the teacher's alone, per token (`hrl.train.distill`, `distill.teacher`);
             no trace is dropped for its group's agreeing rewards. Any other kind with a teacher adds that dense
             term to the trace's advantage.
Groups whose rewards all agree carry no signal under a group baseline: they are reported, and dropped when asked
(for "batch" too, if asked).
"""

from __future__ import annotations

import math
from collections import defaultdict

from hrl.config.train import AdvantageKind

__all__ = ["AdvantageKind", "group_advantages", "lone_advantages"]


def _mean_std(rs: list[float]) -> tuple[float, float]:
    mean = sum(rs) / max(len(rs), 1)
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rs) / max(len(rs), 1))  # population std, as in GRPO


def group_advantages(
    rewards: dict[str, float],
    groups: dict[str, str],
    kind: AdvantageKind = "grpo",
    eps: float = 1e-6,
    drop_zero_variance: bool = False,
) -> tuple[dict[str, float], dict[str, float]]:
    """Advantages per trace id, and metrics. `rewards`: trace id → reward; `groups`: trace id → group id.

    Dropped traces (zero-variance groups when `drop_zero_variance`) are absent from the result.
    """
    members: dict[str, list[str]] = defaultdict(list)
    for tid in rewards:
        members[groups[tid]].append(tid)
    adv: dict[str, float] = {}
    zero_var = 0
    whole = _mean_std(list(rewards.values())) if kind == "batch" else (0.0, 0.0)
    for tids in members.values():
        rs = [rewards[t] for t in tids]
        mean, std = _mean_std(rs)
        if std < eps:
            zero_var += 1
            if drop_zero_variance and kind != "distill":
                continue
        if kind == "batch":
            mean, std = whole
        for t, r in zip(tids, rs, strict=True):
            adv[t] = 0.0 if kind == "distill" else (r - mean) / (std + eps) if kind in ("grpo", "batch") else r - mean
    n_groups = max(len(members), 1)
    metrics = {
        "adv/groups": float(len(members)),
        "adv/zero_variance_groups": float(zero_var),
        "adv/zero_variance_frac": zero_var / n_groups,
        "adv/dropped_traces": float(len(rewards) - len(adv)),
        "adv/mean_abs": sum(abs(a) for a in adv.values()) / max(len(adv), 1),
    }
    return adv, metrics


def lone_advantages(
    rewards: dict[str, float],
    groups: dict[str, str],
    kind: AdvantageKind = "grpo",
    baselines: dict[str, float] | None = None,
    eps: float = 1e-6,
) -> tuple[dict[str, float], dict[str, float]]:
    """Online traffic, where most traces come without a group: a group of ≥ 2 traces in the batch gets `kind` within
    itself (`group_advantages`); a trace alone in its group gets r − its `baselines` entry (a running per-task mean
    reward) where it has one, else the batch baseline over the batch's lone traces, (r − mean) / std, as "batch"
    does. `adv/lone_traces` counts the lone ones, `adv/task_baselined` those with a baseline of their own."""
    members: dict[str, list[str]] = defaultdict(list)
    for tid in rewards:
        members[groups[tid]].append(tid)
    lone = [tids[0] for tids in members.values() if len(tids) == 1]
    grouped = {t: r for t, r in rewards.items() if t not in set(lone)}
    adv, metrics = group_advantages(grouped, groups, kind)
    mean, std = _mean_std([rewards[t] for t in lone])
    with_own = [t for t in lone if baselines and t in baselines]
    for t in lone:
        if kind == "distill":  # the teacher's signal alone: no reward term to baseline
            adv[t] = 0.0
        else:
            adv[t] = rewards[t] - baselines[t] if t in with_own else (rewards[t] - mean) / (std + eps)  # type: ignore[index]
    metrics["adv/groups"] += len(lone)
    metrics["adv/lone_traces"] = float(len(lone))
    metrics["adv/task_baselined"] = float(len(with_own))
    metrics["adv/mean_abs"] = sum(abs(a) for a in adv.values()) / max(len(adv), 1)
    return adv, metrics
