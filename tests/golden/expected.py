"""What a golden trace file must turn into: its samples (digests of every field) and a loss over the whole batch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

FIELDS = ("input_ids", "loss_mask", "behaviour_logprobs", "versions", "weight")


def _digest(values: list[Any]) -> str:
    rounded = [round(v, 9) if isinstance(v, float) else v for v in values]
    return hashlib.blake2b(json.dumps(rounded).encode(), digest_size=10).hexdigest()


def describe_samples(samples: list[Any]) -> list[dict[str, Any]]:
    out = []
    for s in samples:
        d = asdict(s)
        out.append(
            {
                "branch": d["branch"],
                "tokens": len(d["input_ids"]),
                "loss_tokens": sum(d["loss_mask"]),
                "versions": sorted(set(d["versions"]) - {-1}),
                **{f: _digest(d[f]) for f in FIELDS},
            }
        )
    return out


def expected_for(path: Path) -> dict[str, Any]:
    from hrl.runners.trace import read_traces
    from hrl.train.samples import build_samples

    (trace,) = list(read_traces(path))
    return {
        "samples": describe_samples(build_samples(trace)),
        "samples_with_side": describe_samples(build_samples(trace, include_side=True)),
    }


def batch_loss(paths: list[Path]) -> float:
    """The clipped-ratio loss of all golden traces as one GRPO group, with a fixed made-up current policy
    (behaviour logprob − 0.01·(k mod 7) at the batch's loss token k): pins samples, weights and advantages together."""
    import torch

    from hrl.runners.trace import read_traces
    from hrl.train.advantages import group_advantages
    from hrl.train.loss import policy_loss
    from hrl.train.samples import build_samples

    traces = [t for p in paths for t in read_traces(p)]
    adv, _ = group_advantages({t["trace_id"]: float(t["reward"]) for t in traces}, dict.fromkeys(
        (t["trace_id"] for t in traces), "golden"))  # fmt: skip
    behaviour, advantages, weight = [], [], []
    for t in traces:
        for s in build_samples(t):
            for j, m in enumerate(s.loss_mask):
                if m:
                    behaviour.append(s.behaviour_logprobs[j])
                    advantages.append(adv[t["trace_id"]])
                    weight.append(s.weight[j])
    b = torch.tensor(behaviour, dtype=torch.float64)
    logp = b - 0.01 * (torch.arange(len(behaviour)) % 7)
    loss, _ = policy_loss(
        logp, b, torch.tensor(advantages, dtype=torch.float64), torch.tensor(weight, dtype=torch.float64)
    )
    return round(float(loss), 12)
