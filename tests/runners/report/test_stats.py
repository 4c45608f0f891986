"""The evaluation's uncertainty against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from hrl.runners.report.stats import agreement, pass_at_k, succeeded, wilson

# Wilson bounds by hand for n = 10, z = 1.959964 (z² = 3.841459): denominator 1 + z²/n = 1.3841459.
#   0/10:  centre = (0 + 0.19207295) / 1.3841459 = 0.1387664, half = z·√(z²/400) / 1.3841459 = 0.1387664
#   5/10:  centre = 0.5, half = z·√(0.025 + 0.00960365) / 1.3841459 = 0.2634069
#   1/1:   centre = (1 + 1.9207295) / 4.841459 = 0.6032774, half = z·√(z²/4) / 4.841459 = 0.3967281
# 10/10 mirrors 0/10. Quoted to 6 places; 1e-6 covers that rounding (the float64 error is ~1e-16).
EPS = 1e-6


@pytest.mark.parametrize(
    ("wins", "n", "lo", "hi"),
    [(0, 10, 0.0, 0.277533), (10, 10, 0.722467, 1.0), (5, 10, 0.236593, 0.763407), (1, 1, 0.206549, 1.0)],
)
def test_wilson_against_hand_values(wins, n, lo, hi):
    got = wilson(wins, n)
    assert got is not None and abs(got[0] - lo) < EPS and abs(got[1] - hi) < EPS


def test_wilson_without_episodes_and_with_impossible_counts():
    assert wilson(0, 0) is None
    with pytest.raises(ValueError, match="11 successes out of 10"):
        wilson(11, 10)


def test_pass_at_k_against_hand_values():
    # n=4, c=1: pass@1 = 1 - C(3,1)/C(4,1) = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    assert math.isclose(pass_at_k(4, 1, 1), 0.25) and math.isclose(pass_at_k(4, 1, 2), 0.5)
    assert pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 0, 4) == 0.0  # fewer failures than k / no success
    with pytest.raises(ValueError, match="needs 0 < k"):
        pass_at_k(2, 1, 3)


def test_agreement_pairs_compare_shared_tasks_only():
    solved = {"a": {"t1": True, "t2": False, "t3": True}, "b": {"t1": True, "t2": True}, "c": {"t1": False}}
    assert agreement(solved) == {("a", "b"): (1, 2), ("a", "c"): (0, 1), ("b", "c"): (0, 1)}


def test_success_reads_the_trace_key_then_falls_back_to_reward():
    assert succeeded({"success": False, "reward": 1.0}) is False  # a shaped reward of 1 is no success
    assert succeeded({"success": True, "reward": 0.3}) is True
    assert succeeded({"success": None, "reward": 1.0}) is True  # nothing said: the reward decides
    assert succeeded({"reward": 0.99}) is False and succeeded({"reward": None}) is False
