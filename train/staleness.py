"""Which traces a trainer at a given policy version trains on, and what staleness did to them (`async.staleness`,
`async.max_staleness`): the traces kept, the version below which tokens leave the loss, the groups trained short, and
the counts per bucket of LLM calls a trace made (long episodes span the most publishes). The async loop's and an online
run's steps use them (`hrl.train.async_loop`)."""

from __future__ import annotations

from typing import Any

from hrl.config import AsyncConfig
from hrl.runners.trace import sampled_versions
from hrl.train.samples import token_versions
from hrl.train.step import off_policy

__all__ = [
    "CALL_BUCKETS", "age", "calls_bucket", "newest_version", "oldest_version", "select_fresh", "stale_groups",
    "staleness_by_calls",
]  # fmt: skip

CALL_BUCKETS = ((2, "0-2"), (5, "3-5"), (10, "6-10"))  # LLM calls per trace, up to each bound; above the last: "11+"


def oldest_version(trace: dict[str, Any]) -> int | None:
    """The oldest policy version that sampled any token of the trace (None: no sampled tokens)."""
    versions = [v for c in trace["calls"] for _, v in c.get("versions", [])]
    return min(versions) if versions else None


def newest_version(trace: dict[str, Any]) -> int | None:
    """The newest policy version that sampled any token of the trace (None: no sampled tokens). A version run that
    covers no token (a publish just as a call ended) sampled nothing, so it does not count."""
    versions = [v for c in trace["calls"] if c.get("versions") for v in sampled_versions(c)]
    return max(versions) if versions else None


def select_fresh(
    batch: list[dict[str, Any]], version: int, acfg: AsyncConfig
) -> tuple[list[dict[str, Any]], int | None]:
    """What a trainer at `version` trains on: the traces kept, and with `staleness: mask` the version below which
    their tokens leave the loss (None: drop, every kept trace is fresh throughout). A trace with no sampled token is
    kept, as it has nothing stale, and so is one an online run trains off-policy (`online.late_reward`)."""
    before = version - acfg.max_staleness  # a token of an older version is more than max_staleness versions old
    if acfg.staleness == "drop":
        return [t for t in batch if off_policy(t) or (v := oldest_version(t)) is None or v >= before], None
    return [t for t in batch if off_policy(t) or (v := newest_version(t)) is None or v >= before], before


def stale_groups(batch: list[dict[str, Any]], kept: list[dict[str, Any]]) -> int:
    """Groups of the batch that lost a trace to staleness (trained short, or not at all)."""
    ids = {t["trace_id"] for t in kept}
    return len({str(t.get("group_id")) for t in batch if t["trace_id"] not in ids})


def calls_bucket(trace: dict[str, Any]) -> str:
    """The trace's bucket of LLM calls (`CALL_BUCKETS`): "0-2", "3-5", "6-10" or "11+"."""
    n = len(trace["calls"])
    return next((name for bound, name in CALL_BUCKETS if n <= bound), "11+")


def staleness_by_calls(
    batch: list[dict[str, Any]], kept: list[dict[str, Any]], before: int | None, include_side: bool = False
) -> dict[str, float]:
    """Whether staleness hits long episodes harder: per bucket B of LLM calls per trace (`calls_bucket`, every bucket
    every step), `async/traces/calls_B` (traces of the batch), `async/dropped_stale/calls_B` (of them, left out for
    staleness; the buckets sum to `async/dropped_stale`). With `mask` (`before`: the stale line) also, over the kept
    traces, `async/sampled_tokens/calls_B` (sampled tokens of training calls, each once: `token_versions`) and
    `async/stale_tokens/calls_B` (of those, the ones older than `before`: what the mask takes out of the loss where
    the trace trains; `async/masked_tokens` counts only the traces the step trained on). A trace an online run trains
    off-policy keeps its tokens: none counts as stale."""
    names = [name for _, name in CALL_BUCKETS] + ["11+"]
    out = {f"async/{k}/calls_{b}": 0.0 for b in names for k in ("traces", "dropped_stale")}
    ids = {t["trace_id"] for t in kept}
    for t in batch:
        b = calls_bucket(t)
        out[f"async/traces/calls_{b}"] += 1
        out[f"async/dropped_stale/calls_{b}"] += t["trace_id"] not in ids
    if before is None:
        return out
    out |= {f"async/{k}/calls_{b}": 0.0 for b in names for k in ("sampled_tokens", "stale_tokens")}
    for t in kept:
        versions = token_versions(t, include_side)
        out[f"async/sampled_tokens/calls_{calls_bucket(t)}"] += len(versions)
        out[f"async/stale_tokens/calls_{calls_bucket(t)}"] += 0 if off_policy(t) else sum(v < before for v in versions)
    return out


def age(trace: dict[str, Any], version: int) -> int:
    """Staleness of a trace for a trainer at `version`: versions since its oldest token was sampled."""
    oldest = oldest_version(trace)
    return 0 if oldest is None else version - oldest
