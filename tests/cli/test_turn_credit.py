"""`train.credit: turn` on the command line: it turns the rollouts' turn scores on, and a run whose episodes could
record none (a verifier that cannot score turns, a white-box agent, an online run's clients) is refused before
anything starts (exit 2), never trained on episode credit in silence."""

from __future__ import annotations

import pytest

from hrl.config import RunConfig
from tests.cli.test_error_policy import USAGE, run_hrl


def test_turn_credit_turns_the_rollouts_turn_scores_on():
    assert RunConfig.model_validate({"train": {"credit": "turn"}}).rollout.turn_scores is True
    assert RunConfig.model_validate({}).rollout.turn_scores is False  # episode credit: no hook, no cost


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-c", "verifier.name=miniwob"], "the miniwob verifier cannot"),
        (["--agent", "python:json:dumps"], "python:json:dumps is a white-box Python agent"),
        (["--serve"], "an online run's (--serve) episodes are its clients'"),
    ],
)
def test_turn_credit_that_could_score_nothing_is_refused(argv, needle, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "--recipe", "demo", "--model", "hrl:tiny", "-c", "train.credit=turn", *argv, "--run-dir"]
    code, _, err = run_hrl([*args, str(run_dir)], {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert code == USAGE, err
    assert needle in err and "Hint: use -c train.credit=episode" in err
    assert not run_dir.exists()
