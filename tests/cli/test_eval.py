"""`hrl eval` for real: real agent CLIs on the demo's tasks through the proxy and the embedded engine, one row per
harness on stdout, a run directory whose `hrl report` repeats the table; with --baseline, before / after / delta.
codex is the fast harness here: its fixed prompt overflows the tiny model's context at the first call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.agents

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}


def _hrl(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hrl.cli", *argv]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, env=ENV)


def _codex_tails(run_dir: Path) -> str:
    """What codex printed and what the proxy refused, for a row that is not the expected one."""
    out = []
    for path in sorted((run_dir / "traces").glob("iter-*.jsonl")):
        for line in path.read_text().splitlines():
            trace = json.loads(line)
            if trace["agent"].get("name") == "codex":
                meta = trace["metadata"]
                keys = ("agent_exit_code", "agent_s", "agent_stdout_tail", "agent_stderr_tail")
                out.append(json.dumps({k: meta.get(k) for k in keys} | {"rejected": trace.get("rejected")}, indent=1))
    return "\n".join(out)


def test_eval_prints_one_row_per_harness_and_report_repeats_it(tmp_path: Path):
    # one step of at most 16 tokens for mini-swe-agent: the table's columns are what is checked, not how far it gets
    run = _hrl(
        "eval", "--agents", "mini-swe-agent,codex", "--recipe", "demo", "--model", "hrl:tiny-agent", "--limit", "1",
        "--run-dir", "ev", "-c", "rollout.agent_options.step_limit=1", "-c", "proxy.default_max_tokens=16",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "model hrl:tiny-agent; 1 tasks × 1 episode per task and harness"
    assert lines[1].split() == ["harness", "episodes", "success", "reward", "turns", "tokens/ep", "infra", "failures"]
    assert lines[2].split()[2:5] == ["0%", "(0/1)", "[0–79%]"]  # Wilson 95 % of 0/1: [0, z²/(1 + z²)]
    assert lines[2].startswith("mini-swe-agent  1 ") and lines[3].startswith("codex ")
    assert lines[3].endswith("context_overflow 1"), _codex_tails(tmp_path / "ev")  # the policy's failure, not infra
    assert lines[4].startswith("success: successes / episodes the infrastructure did not fail")
    assert lines[5].startswith("agreement mini-swe-agent ~ codex: 100% of 1 tasks")  # neither solves it
    assert len(list((tmp_path / "ev" / "traces").glob("iter-*.jsonl"))) == 2
    top = _hrl("top", "ev", "--once", "--json", cwd=tmp_path)  # the evaluation kept a live status, as a train run
    assert top.returncode == 0, top.stderr
    snap = json.loads(top.stdout)
    assert snap["status"] == "finished" and snap["in_flight"] == [] and snap["recent_traces"] == 2  # one a harness
    report = _hrl("report", "ev", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "\n".join(lines) in report.stderr  # the same table, line for line
    assert 'id="eval"' in (tmp_path / "ev" / "report.html").read_text()


def test_eval_with_a_baseline_shows_before_after_and_delta(tmp_path: Path):
    run = _hrl(
        "eval", "--agents", "codex", "--recipe", "demo", "--model", "hrl:tiny-agent", "--baseline", "hrl:tiny-agent",
        "--limit", "2", "--run-dir", "ev", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    [row] = json.loads(run.stdout)
    assert row["agent"] == "codex"
    for side in ("baseline", "model"):
        assert row[side]["episodes"] == 2 and row[side]["failures"] == {"context_overflow": 2}
    assert row["delta"]["success_rate"] == 0.0
    plan = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert [(c["iteration"], c["role"]) for c in plan["cells"]] == [(0, "baseline"), (1, "model")]
    report = _hrl("report", "ev", "--json", cwd=tmp_path)
    assert json.loads(report.stdout)["eval"] == [row]
