"""`hrl rollout`'s closing lines say why: the mean over rewarded episodes (and how many had no reward), the failures
by reason, and for exit 3 which infrastructure failures pushed the run over `max_error_rate`, with a hint."""

from __future__ import annotations

from pathlib import Path

from hrl.cli.rollout import _summary


def _t(reward, reason=None):
    return {"reward": reward, "failure_reason": reason}


def test_summary_skips_missing_rewards_and_names_failures(capsys):
    traces = [_t(1.0), _t(0.0, "agent_timeout"), _t(None, "sandbox_error"), _t(0.5)]
    assert _summary(traces, Path("out.jsonl"), max_error_rate=0.5) == 0
    line = capsys.readouterr().err
    assert "mean reward 0.500 over 3 (1 without a reward)" in line
    assert "failures: agent_timeout 1, sandbox_error 1" in line


def test_too_many_infrastructure_failures_exit_3_saying_which(capsys):
    traces = [_t(None, "sandbox_error"), _t(None, "engine_error"), _t(None, "sandbox_error"), _t(0.0)]
    assert _summary(traces, Path("out.jsonl"), max_error_rate=0.25) == 3
    err = capsys.readouterr().err.splitlines()
    assert "no rewarded" not in err[0] and "mean reward 0.000 over 1 (3 without a reward)" in err[0]
    assert err[1].startswith("Error: 3 of 4 episodes failed in the infrastructure (engine_error 1, sandbox_error 2)")
    assert err[2].startswith("Hint: ") and "hrl inspect out.jsonl" in err[2]


def test_no_rewarded_episode_says_so(capsys):
    assert _summary([_t(None, "cancelled")], Path("o.jsonl"), max_error_rate=0.25) == 0
    assert "no rewarded episode (1 without a reward)" in capsys.readouterr().err
