"""Per-trace advantages, computed once per trace and broadcast to all its branch samples.

Group = the traces of one task (`group_id`) in one batch. Variants:
- "grpo":    (r - mean_group) / (std_group + eps)       — Shao et al. 2024, DeepSeekMath (GRPO)
- "mean":    r - mean_group                              — GRPO without std normalisation; the loss keeps the
             trainer's `loss_norm` (by default a token mean per trace)
- "dr_grpo": r - mean_group AND the loss summed over tokens ÷ a constant (`trainer.max_len` × traces), not by
             length — Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO), which removes both
             biases. The advantages are those of "mean"; `LoopConfig` sets `trainer.loss_norm: constant` for it
             and rejects an explicit `loss_norm: trace`.
Groups whose rewards all agree carry no signal: they are reported, and dropped when asked.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

__all__ = ["AdvantageKind", "group_advantages"]

AdvantageKind = Literal["grpo", "mean", "dr_grpo"]


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
    for tids in members.values():
        rs = [rewards[t] for t in tids]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))  # population std, as in GRPO
        if std < eps:
            zero_var += 1
            if drop_zero_variance:
                continue
        for t, r in zip(tids, rs, strict=True):
            adv[t] = (r - mean) / (std + eps) if kind == "grpo" else r - mean
    n_groups = max(len(members), 1)
    metrics = {
        "adv/groups": float(len(members)),
        "adv/zero_variance_groups": float(zero_var),
        "adv/zero_variance_frac": zero_var / n_groups,
        "adv/dropped_traces": float(len(rewards) - len(adv)),
        "adv/mean_abs": sum(abs(a) for a in adv.values()) / max(len(adv), 1),
    }
    return adv, metrics
