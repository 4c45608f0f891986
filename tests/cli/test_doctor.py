"""`hrl doctor --model M` through the real CLI: the served-model probe's findings, human and --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def hrl_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hrl.cli", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})


def test_probe_findings_human_and_json(tiny_model):
    human = hrl_doctor("--model", tiny_model, "--engine", "scripted")
    assert "✓ tool parser   hermes (detected" in human.stdout
    assert "✓ reasoning     think (detected" in human.stdout
    assert "! tool calls    none of 3 replies called a tool" in human.stdout  # a finding, not a failure
    assert "✓ logprobs      not checked: the scripted engine samples nothing" in human.stdout
    data = {
        c["name"]: c for c in json.loads(hrl_doctor("--model", tiny_model, "--engine", "scripted", "--json").stdout)
    }
    assert data["tool calls"]["ok"] is False and data["tool calls"]["blocking"] is False
    blocking_failed = [c for c in data.values() if c["blocking"] and not c["ok"]]
    assert human.returncode == (4 if blocking_failed else 0), human.stderr


def test_no_probe_starts_nothing(tiny_model):
    out = hrl_doctor("--model", tiny_model, "--no-probe", "--json")
    names = [c["name"] for c in json.loads(out.stdout)]
    assert "tool parser" in names and "tool calls" not in names and "logprobs" not in names
