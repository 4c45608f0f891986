"""`hrl regrade` on a browser run: `hrl rollout --recipe browser` (the Playwright agent acting on the scripted
engine's replies in local Chromium) records each page's inputs, and regrading replays them on fresh pages of the
same seeds: they agree with every recorded reward (solved and not) but one altered on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def hrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hrl.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "NO_COLOR": "1"})  # fmt: skip


def test_a_browser_rollout_regrades_from_its_pages_inputs(tmp_path: Path, tiny_model: str) -> None:
    turns = json.dumps(["click Click Me!", "done"])  # solves click-test; on click-button's seed 0 no such button
    run = hrl("rollout", "--recipe", "browser", "--sandbox", "local", "--model", tiny_model, "--engine", "scripted",
              "-c", f"engine_options.turns={turns}", "--tasks", "miniwob:click-test,click-button", "-n", "2",
              "--out", "traces.jsonl", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert sorted((t["task_id"], t["reward"]) for t in traces) == [
        ("miniwob.click-button.s0", 0.0), ("miniwob.click-button.s0", 0.0),
        ("miniwob.click-test.s0", 1.0), ("miniwob.click-test.s0", 1.0)]  # fmt: skip
    recorded = json.loads(traces[0]["metadata"]["patch"])
    assert recorded["format"] == "hrl.miniwob-inputs/1" and recorded["inputs"]

    altered = tmp_path / "altered.jsonl"  # one click-test episode recorded as unsolved, the others as they were
    first = next(t for t in traces if t["reward"] == 1.0)
    altered.write_text("".join(json.dumps({**t, "reward": 0.0} if t is first else t) + "\n" for t in traces))
    graded = hrl("regrade", "altered.jsonl", "--json", cwd=tmp_path)
    assert graded.returncode == 1, graded.stderr[-3000:]
    summary = json.loads(graded.stdout)
    assert (summary["regraded"], summary["agreed"], summary["not_regradable"]) == (4, 3, [])
    (disagreement,) = summary["disagreements"]
    assert disagreement["trace_id"] == first["trace_id"] and disagreement["regraded"] == 1.0
    assert "raw score 1" in disagreement["why"]
