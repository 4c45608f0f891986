"""`hrl keys`: a client key is printed once, the keys file keeps its digest only (0600), a name is taken once, and the
run's ClientKeys knows the key by its name (a key added while it runs too)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from hrl.cli.main import app
from hrl.runners.online import ClientKeys


def test_keys_add_prints_a_key_the_run_knows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    keys = ClientKeys(run / "client_keys.json")
    assert keys.name_for("hrlc-anything") is None  # no file yet: no key
    first = CliRunner().invoke(app, ["keys", "add", "fleet", "--run-dir", str(run)])
    assert first.exit_code == 0, first.output
    key = first.stdout.strip().splitlines()[-1]
    assert key.startswith("hrlc-") and keys.name_for(key) == "fleet"
    stored = (run / "client_keys.json").read_text()
    assert key not in stored and json.loads(stored)["keys"][0]["name"] == "fleet"
    assert (run / "client_keys.json").stat().st_mode & 0o777 == 0o600
    again = CliRunner().invoke(app, ["keys", "add", "fleet", "--run-dir", str(run)])
    assert again.exit_code != 0 and "already has a client key named fleet" in str(again.exception or again.output)
    out = CliRunner().invoke(app, ["keys", "add", "ci", "--run-dir", str(run), "--json"])
    ci = json.loads(out.stdout.strip().splitlines()[-1])
    assert keys.name_for(ci["key"]) == "ci" and keys.name_for(key + "x") is None
    listed = CliRunner().invoke(app, ["keys", "ls", "--run-dir", str(run), "--json"])
    assert json.loads(listed.stdout) == ["fleet", "ci"]
