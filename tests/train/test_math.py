"""Losses, advantages and sample building against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hrl.train.advantages import group_advantages
from hrl.train.loop import LoopConfig
from hrl.train.loss import importance_weights, kl_to_reference, mismatch_kl, policy_loss
from hrl.train.samples import build_samples, retained_tokens
from hrl.train.trainer import TrainerConfig, token_weights


def _call(cid, prompt=None, ref=None, suffix=(), resp=(), parent=None, side=False, finish="stop", versions=None):
    """A recorded call; `versions`: its runs of [first token, version] (default: every token of version 3)."""
    c = {
        "call_id": cid,
        "dialect": "chat",
        "stream": False,
        "side": side,
        "response_ids": list(resp),
        "response_logprobs": [-0.5] * len(resp),
        "versions": versions or [[0, 3]],
        "finish_reason": finish,
    }
    if ref:
        c["prompt_ref"], c["prompt_suffix_ids"] = {"call_id": ref[0], "length": ref[1]}, list(suffix)
    else:
        c["prompt_ids"] = list(prompt)
    if parent:
        c["parent"] = parent
    return c


def _trace(calls, tid="t", reward=1.0):
    return {
        "schema": "hrl.trace/1",
        "trace_id": tid,
        "group_id": "g",
        "session": "s",
        "status": "ok",
        "reward": reward,
        "started_at": 0,
        "ended_at": 1,
        "calls": calls,
    }


LINEAR = [
    _call("a", prompt=[1, 2, 3], resp=[4, 5]),
    _call("b", ref=("a", 5), suffix=[6], resp=[7, 8], parent="a"),
    _call("c", ref=("b", 8), suffix=[9], resp=[10], parent="b"),
]


def test_linear_trace_is_one_sample_with_exact_mask():
    (s,) = build_samples(_trace(LINEAR))
    assert s.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 1, 1, 0, 1]
    assert s.behaviour_logprobs == [0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5, 0, -0.5]
    assert s.versions == [-1, -1, -1, 3, 3, -1, 3, 3, -1, 3]
    assert sum(s.weight) == pytest.approx(1.0)
    assert s.weight[3] == pytest.approx(1 / 5)


def test_branching_trace_weighs_the_same_as_an_unsplit_one():
    # c2 is a compaction: a new root. d is a side call (excluded). The trace has 3 branches:
    # a->b, a->e (b and e both extend a), and the new root c2.
    calls = [
        _call("a", prompt=[1, 2], resp=[3, 4]),
        _call("b", ref=("a", 4), suffix=[5], resp=[6], parent="a"),
        _call("e", ref=("a", 4), suffix=[7], resp=[8, 9], parent="a"),
        _call("d", prompt=[50], resp=[51], side=True),
        _call("c2", prompt=[1, 9, 9], resp=[10, 11, 12]),
        _call("x", prompt=[1], resp=[2], finish="error"),
    ]
    samples = build_samples(_trace(calls))
    assert [s.branch for s in samples] == [["a", "b"], ["a", "e"], ["c2"]]
    assert [s.branch for s in build_samples(_trace(calls), include_side=True)][-2:] == [["d"], ["c2"]]
    # distinct sampled tokens: a(2) + b(1) + e(2) + c2(3) = 8; a's tokens are shared by 2 branches
    assert sum(sum(s.weight) for s in samples) == pytest.approx(1.0)
    assert samples[0].weight[2] == pytest.approx(1 / (2 * 8))
    assert samples[0].weight[5] == pytest.approx(1 / 8)
    # the same loss tokens unsplit weigh exactly one trace, like the split version
    (single,) = build_samples(_trace([_call("a", prompt=[1, 2], resp=[3, 4, 5, 6, 7, 8, 9, 10])]))
    assert sum(single.weight) == pytest.approx(1.0)


def test_a_trace_with_subagents_weighs_one_and_leaves_untrained_agents_out():
    # root agent a -> b; a trained sub-agent's branch h1 -> h2; an untrained critic k (recorded, never trained)
    calls = [
        _call("a", prompt=[1, 2], resp=[3, 4]),
        _call("h1", prompt=[20, 21], resp=[22]) | {"agent": "helper"},
        _call("k", prompt=[30, 31], resp=[32, 33, 34]) | {"agent": "critic", "trainable": False},
        _call("h2", ref=("h1", 3), suffix=[23], resp=[24, 25], parent="h1") | {"agent": "helper"},
        _call("b", ref=("a", 4), suffix=[5], resp=[6], parent="a"),
    ]
    samples = build_samples(_trace(calls))
    assert [s.branch for s in samples] == [["h1", "h2"], ["a", "b"]]
    # one unit of loss weight for the episode, spread over its trainable tokens: a(2) + b(1) + h1(1) + h2(2) = 6
    assert sum(sum(s.weight) for s in samples) == pytest.approx(1.0)
    assert all(w in (0.0, pytest.approx(1 / 6)) for s in samples for w in s.weight)
    assert all(s.reward == 1.0 for s in samples)  # one reward (hence one advantage) for the whole agent tree


def test_retained_tokens_counts_sampled_ids_found_under_the_mask_once():
    calls = [
        _call("a", prompt=[1, 2], resp=[3, 4]),
        _call("b", ref=("a", 4), suffix=[5], resp=[6], parent="a"),
        _call("e", ref=("a", 4), suffix=[7], resp=[8, 9], parent="a"),
        _call("d", prompt=[50], resp=[51], side=True),
        _call("x", prompt=[1], resp=[2], finish="error"),
    ]
    trace = _trace(calls)
    samples = build_samples(trace)
    assert retained_tokens(trace, samples) == (5, 5)  # a's 2 tokens shared by two branches count once; d, x left out
    assert retained_tokens(trace, build_samples(trace, include_side=True), include_side=True) == (6, 6)
    assert retained_tokens(trace, samples[:1]) == (3, 5)  # a branch lost: e's tokens were sampled, never trained
    samples[0].input_ids[2] = 99  # a target that is not the sampled id (re-tokenized text) does not count
    samples[1].input_ids[2] = 99
    assert retained_tokens(trace, samples) == (4, 5)
    samples[0].loss_mask[3] = 0  # nor does a sampled id left unmasked
    samples[1].loss_mask[3] = 0
    assert retained_tokens(trace, samples) == (3, 5)


def test_group_advantages_variants():
    rewards = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 0.5, "f": 0.5}
    groups = {"a": "g1", "b": "g1", "c": "g1", "d": "g1", "e": "g2", "f": "g2"}
    adv, m = group_advantages(rewards, groups, "grpo")
    assert adv["a"] == pytest.approx(0.5 / (0.5 + 1e-6))
    assert adv["b"] == pytest.approx(-0.5 / (0.5 + 1e-6))
    assert adv["e"] == 0.0
    assert m["adv/zero_variance_groups"] == 1.0
    adv, _ = group_advantages(rewards, groups, "dr_grpo")
    assert adv["a"] == pytest.approx(0.5)
    assert adv["b"] == pytest.approx(-0.5)
    adv, m = group_advantages(rewards, groups, "mean", drop_zero_variance=True)
    assert set(adv) == {"a", "b", "c", "d"}
    assert m["adv/dropped_traces"] == 2.0


def test_batch_advantages_push_down_a_group_that_all_failed_when_another_succeeded():
    """One baseline over the batch: the failed group (c, d) gets the same negative advantage as the failure b beside
    the success a, where a group baseline gives it none; the advantages sum to 0, so a token every episode shares
    is not moved; a batch that all agrees teaches nothing."""
    rewards, groups = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}, {"a": "g1", "b": "g1", "c": "g2", "d": "g2"}
    std = (0.25 * 0.75) ** 0.5  # population std of [1, 0, 0, 0]
    adv, m = group_advantages(rewards, groups, "batch")
    assert adv["a"] == pytest.approx(0.75 / (std + 1e-6))
    assert adv["b"] == adv["c"] == adv["d"] == pytest.approx(-0.25 / (std + 1e-6))
    assert sum(adv.values()) == pytest.approx(0.0, abs=1e-9)
    assert group_advantages(rewards, groups, "grpo")[0]["c"] == 0.0
    assert m["adv/zero_variance_groups"] == 1.0  # still reported: g2 agrees within itself
    assert set(group_advantages(rewards, groups, "batch", drop_zero_variance=True)[0]) == {"a", "b"}
    assert set(group_advantages(dict.fromkeys(rewards, 0.0), groups, "batch")[0].values()) == {0.0}


def test_dr_grpo_is_mean_advantages_and_the_constant_normaliser():
    """Dr. GRPO (Liu et al. 2025) = no std scaling + loss ÷ a constant. One group: a short right answer (2 tokens,
    r=1) and a long wrong one (4 tokens, r=0), so advantages ±0.5; ratio 1, so the loss is −Σ weight · advantage.
    Per-trace token mean: −(2·(1/2)/2·0.5 + 4·(1/4)/2·(−0.5)) = 0, length cancels out. Constant, max_len=8:
    every token weighs 1/(8·2); −(2·0.5 − 4·0.5)/16 = +1/16, the long wrong answer pushed down per token."""
    short = _trace([_call("a", prompt=[1], resp=[2, 3])], tid="short", reward=1.0)
    long = _trace([_call("a", prompt=[1], resp=[4, 5, 6, 7])], tid="long", reward=0.0)
    adv, _ = group_advantages({"short": 1.0, "long": 0.0}, {"short": "g", "long": "g"}, "dr_grpo")
    assert adv == group_advantages({"short": 1.0, "long": 0.0}, {"short": "g", "long": "g"}, "mean")[0]
    assert adv == pytest.approx({"short": 0.5, "long": -0.5})
    samples = build_samples(short) + build_samples(long)
    advantages = torch.tensor([0.5, 0.5, -0.5, -0.5, -0.5, -0.5])
    zero = torch.zeros(6)

    trace_w = token_weights(samples, 2, "trace", max_len=8)
    assert trace_w.tolist() == pytest.approx([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
    assert float(policy_loss(zero, zero, advantages, trace_w)[0]) == pytest.approx(0.0)
    const_w = token_weights(samples, 2, "constant", max_len=8)
    assert const_w.tolist() == pytest.approx([1 / 16] * 6)
    assert float(policy_loss(zero, zero, advantages, const_w)[0]) == pytest.approx(1 / 16)


def test_dr_grpo_sets_the_constant_normaliser_and_refuses_a_contradiction():
    cfg = LoopConfig(advantage="dr_grpo", trainer=TrainerConfig(model="m"))
    assert cfg.trainer.loss_norm == "constant"
    assert LoopConfig(advantage="mean", trainer=TrainerConfig(model="m")).trainer.loss_norm == "trace"
    assert LoopConfig(**cfg.model_dump()).trainer.loss_norm == "constant"  # a resumed run resolves the same
    with pytest.raises(ValueError, match="loss_norm"):
        LoopConfig(advantage="dr_grpo", trainer=TrainerConfig(model="m", loss_norm="trace"))


def test_policy_loss_hand_computed():
    logp = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    old = torch.log(torch.tensor([0.25, 0.5, 1.0]))  # ratios 2, 1, 0.5
    adv = torch.tensor([1.0, 1.0, -1.0])
    w = torch.tensor([0.5, 0.25, 0.25])
    loss, m = policy_loss(logp, old, adv, w, clip_low=0.2, clip_high=0.2)
    # token 1: min(2*1, 1.2*1) = 1.2 ; token 2: 1 ; token 3: min(0.5*-1, 0.8*-1) = -0.8
    assert float(loss) == pytest.approx(-(0.5 * 1.2 + 0.25 * 1.0 + 0.25 * -0.8))
    assert m["train/clip_frac"] == pytest.approx(0.75)  # tokens 1 and 3 are clipped
    loss_hi, _ = policy_loss(logp, old, adv, w, clip_low=0.2, clip_high=0.28)  # DAPO clip-higher
    assert float(loss_hi) == pytest.approx(-(0.5 * 1.28 + 0.25 * 1.0 + 0.25 * -0.8))
    loss_is, _ = policy_loss(logp, old, adv, w, behaviour_weight=torch.tensor([2.0, 1.0, 1.0]))
    assert float(loss_is) == pytest.approx(-(0.5 * 2.4 + 0.25 * 1.0 + 0.25 * -0.8))


def test_policy_gradient_direction():
    logp = torch.log(torch.tensor([0.5])).requires_grad_()
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.tensor([1.0]))
    loss.backward()
    assert logp.grad is not None
    assert float(logp.grad) == pytest.approx(-1.0)


def test_importance_weights_and_kls():
    prox, behav = torch.log(torch.tensor([0.9, 0.1])), torch.log(torch.tensor([0.3, 0.1]))
    w, m = importance_weights(prox, behav, cap=2.0)
    assert w.tolist() == pytest.approx([2.0, 1.0])
    assert m["train/is_capped_frac"] == 0.5
    w, _ = importance_weights(prox, behav, cap=None)
    assert w.tolist() == pytest.approx([3.0, 1.0])
    kl, _ = kl_to_reference(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25])), torch.tensor([1.0]))
    assert float(kl) == pytest.approx(0.5 - math.log(0.5) - 1)
    mk = mismatch_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0]))
    assert mk["train/mismatch_kl"] == 0.0
    assert mk["train/mismatch_max_abs"] == 0.0
