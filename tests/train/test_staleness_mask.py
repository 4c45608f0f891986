"""`async.staleness: mask`: only tokens older than `version - max_staleness` leave the loss, the rest of their trace
and its group train; `drop` leaves the whole trace out. Hand-built traces with mixed per-token versions, the real
selection, sample builder and trainer step."""

from __future__ import annotations

import pydantic
import pytest

from hrl.train.async_loop import AsyncConfig
from hrl.train.loop import LoopConfig
from hrl.train.samples import build_samples, mask_stale
from hrl.train.staleness import newest_version, select_fresh, stale_groups
from hrl.train.step import update_from_traces
from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_math import _call as math_call


def _call(cid: str, resp: list[int], versions: list[list[int]], prompt=(), ref=None, suffix=(), parent=None) -> dict:
    """A recorded call whose tokens carry `versions` (runs: [first token, version])."""
    return math_call(cid, prompt=prompt, ref=ref, suffix=suffix, resp=resp, parent=parent, versions=versions)


def _trace(tid: str, group: str, reward: float, calls: list[dict]) -> dict:
    return {"trace_id": tid, "group_id": group, "task_id": group, "reward": reward, "calls": calls}


def _branching(tid: str = "mixed", group: str = "g") -> dict:
    """Call a (versions 3 3 5 5) then two children of it, b (4 6 6) and c (5 5): two branches sharing a.
    Positions: a's prompt 0-1, a's response 2-5; b's and c's prompt extends a's by one token (6), responses 7-9 / 7-8."""
    return _trace(tid, group, 1.0, [
        _call("a", [10, 11, 12, 13], [[0, 3], [2, 5]], prompt=[1, 2]),
        _call("b", [30, 31, 32], [[0, 4], [1, 6]], ref=("a", 6), suffix=[20], parent="a"),
        _call("c", [40, 41], [[0, 5]], ref=("a", 6), suffix=[21], parent="a"),
    ])  # fmt: skip


def test_mask_takes_exactly_the_stale_tokens_out_of_the_loss():
    trace = _branching()
    samples = build_samples(trace)
    assert [s.branch for s in samples] == [["a", "b"], ["a", "c"]]
    assert [s.loss_mask for s in samples] == [[0, 0, 1, 1, 1, 1, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1, 0, 1, 1]]
    weights = [list(s.weight) for s in samples]
    # tokens of versions 3 and 4 are older than 5: a's first two (shared by both branches, counted once), b's first
    assert mask_stale(trace, samples, before=5) == 3
    assert [s.loss_mask for s in samples] == [[0, 0, 0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 0, 1, 1]]
    assert [s.weight for s in samples] == weights  # kept as built: a fresh token weighs what it did
    assert mask_stale(trace, build_samples(trace), before=3) == 0  # nothing older than the oldest token


def test_mask_keeps_the_group_whole_and_drops_only_a_trace_with_no_fresh_token():
    mixed, fresh = _branching("mixed"), _branching("fresh")
    for c in fresh["calls"]:
        c["versions"] = [[0, 6]]
    batch = [mixed, fresh]
    # trainer at version 6, max_staleness 1: tokens of versions older than 5 are stale; mixed's oldest is 3
    kept, before = select_fresh(batch, 6, AsyncConfig(max_staleness=1, staleness="mask"))
    assert kept == batch and before == 5 and stale_groups(batch, kept) == 0
    kept, before = select_fresh(batch, 6, AsyncConfig(max_staleness=1, staleness="drop"))
    assert kept == [fresh] and before is None and stale_groups(batch, kept) == 1
    # every token older than 7 - 1 = 6 except b's last two (version 6): kept; at 8 nothing is fresh: dropped
    assert newest_version(mixed) == 6
    assert select_fresh(batch, 7, AsyncConfig(max_staleness=1, staleness="mask"))[0] == batch
    kept, _ = select_fresh(batch, 8, AsyncConfig(max_staleness=1, staleness="mask"))
    assert kept == [] and stale_groups(batch, kept) == 1
    with pytest.raises(pydantic.ValidationError):
        AsyncConfig(staleness="clip")


def _linear(tid: str, group: str, reward: float, versions: list[list[int]]) -> dict:
    """One call of 6 sampled tokens with the given version runs, then a child call of 4 at version 6."""
    return _trace(tid, group, reward, [
        _call(f"{tid}-1", [10, 11, 12, 13, 14, 15], versions, prompt=[1, 2, 3]),
        _call(f"{tid}-2", [16, 17, 18, 19], [[0, 6]], ref=(f"{tid}-1", 9), suffix=[4], parent=f"{tid}-1"),
    ])  # fmt: skip


@pytest.fixture(scope="module")
def trainer(tiny_model) -> Trainer:
    return Trainer(TrainerConfig(model=tiny_model, mode="full", device="cpu", lr=1e-3))


def test_drop_loses_the_group_member_mask_keeps_it_with_its_stale_tokens_out(trainer):
    """Two groups of two at trainer version 6 with max_staleness 1. g0's first trace sampled its first 3 tokens at
    version 4 (stale), the rest at 5 and 6. Drop leaves g0 with one trace, so no learning signal; mask trains all four
    traces, every sampled token but those 3."""
    batch = [
        _linear("g0-0", "g0", 1.0, [[0, 4], [3, 5]]),
        _linear("g0-1", "g0", 0.0, [[0, 6]]),
        _linear("g1-0", "g1", 0.0, [[0, 5]]),
        _linear("g1-1", "g1", 1.0, [[0, 6]]),
    ]
    cfg = LoopConfig(group_size=2, trainer=trainer.config)
    out = {}
    for mode in ("drop", "mask"):
        acfg = AsyncConfig(max_staleness=1, staleness=mode)
        kept, before = select_fresh(batch, 6, acfg)
        out[mode] = update_from_traces(trainer, kept, cfg, before) | {"stale_groups": stale_groups(batch, kept)}
    drop, mask = out["drop"], out["mask"]
    assert drop["train/trained_traces"] == 3 and drop["stale_groups"] == 1
    assert drop["adv/groups"] == 2 and drop["adv/zero_variance_groups"] == 1  # g0 short: a lone trace, advantage 0
    assert "async/masked_tokens" not in drop  # drop masks nothing
    assert mask["train/trained_traces"] == 4 and mask["stale_groups"] == 0
    assert mask["adv/groups"] == 2 and mask["adv/zero_variance_groups"] == 0  # g0 whole: rewards 1 and 0
    assert mask["async/masked_tokens"] == 3
    # loss tokens: 10 sampled per trace (linear traces: no token in two branches); the mask takes 3 of g0-0's
    assert drop["train/loss_tokens"] == 3 * 10 and mask["train/loss_tokens"] == 4 * 10 - 3
    # the retained-token check is taken before the mask: it still measures tokenization only
    assert drop["train/retained_token_ratio"] == mask["train/retained_token_ratio"] == 1.0
