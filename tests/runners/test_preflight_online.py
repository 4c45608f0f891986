"""`hrl train --serve` refuses, before anything starts, the settings an online run would ignore: a step takes
`async.batch_traces` final traces from clients, in the groups the clients give them, so `-c train.group_size=2 -c
train.tasks_per_iteration=1` once left four rewarded traces untrained for 15 minutes with nothing said. Exit 2,
one `Error:` naming each setting and what acts instead, one `Hint:`, no run directory, no model built. The recipe's
own values are not refused (one recipe serves both kinds of run), nor are the settings of a run that is not online."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrl.config import RunConfig
from hrl.runners.errors import UsageError
from hrl.runners.preflight import IGNORED, check_online_settings
from hrl.runners.recipe_config import load_recipe_config
from tests.cli.test_error_policy import USAGE, run_hrl

SERVE = ("train", "--recipe", "demo", "--serve", "--model", "hrl:tiny", "--run-dir", "run")


def test_settings_an_online_run_ignores_are_refused_before_anything_starts(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [*SERVE, "-c", "train.group_size=2", "-c", "train.tasks_per_iteration=1"]
    code, _out, err = run_hrl(argv, {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    hints = [line for line in err.splitlines() if line.startswith("Hint: ")]
    assert code == USAGE and len(errors) == 1 and len(hints) == 1, err
    needles = ("--serve", "train.group_size=2", "train.tasks_per_iteration=1", "async.batch_traces=8", "same group")
    assert all(n in errors[0] for n in needles), errors[0]
    assert "-c async.batch_traces=N" in hints[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()
    assert not (tmp_path / "cache").exists()  # refused before the model was built


def _serve(online: bool = True, **sections: dict[str, object]) -> RunConfig:
    """The demo recipe as `hrl train --serve` resolves it, with `sections` set over it (as `-c` would)."""
    cfg = load_recipe_config("demo") | {"recipe": "demo", "online": {"enabled": online}}
    for name, values in sections.items():
        cfg[name] = {**(cfg.get(name) or {}), **values}
    return RunConfig.model_validate(cfg)


def test_only_what_this_run_gave_is_refused() -> None:
    check_online_settings(_serve())  # the recipe's own group_size, tasks, … : a recipe serves both kinds of run
    recipe_group = load_recipe_config("demo")["train"]["group_size"]
    check_online_settings(_serve(train={"group_size": recipe_group}))  # the recipe's value, said again
    check_online_settings(_serve(train={"iterations": 3, "concurrency": 2}, **{"async": {"batch_traces": 4}}))
    check_online_settings(_serve(False, train={"group_size": 2}))  # a run that starts its own episodes reads them all
    with pytest.raises(UsageError, match=r"ignores async\.max_in_flight=64: .*async\.batch_traces=4 "):
        check_online_settings(_serve(**{"async": {"max_in_flight": 64, "batch_traces": 4}}))
    assert set(IGNORED) >= {"train.group_size", "train.tasks_per_iteration"}
