"""bench/real_model_learning.py --tiny with hrl's tiny model (the real one is too slow for CI): the warm start, one
`hrl train` seed and the card, whose fields are all there, whose Wilson intervals are well-formed and whose episodes
`hrl regrade` grades again, all agreeing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from real_model_learning import wilson  # noqa: E402

FIELDS = ("model", "model_sha256", "harness", "harness_version", "recipe", "recipe_sha256", "seeds", "per_seed",
          "heldout", "wall_s", "engine", "cpu", "grader_agreement", "command")  # fmt: skip


def test_wilson_intervals():
    assert wilson(0, 0) == [0.0, 1.0]
    lo, hi = wilson(0, 48)
    assert lo == 0.0 and 0.05 < hi < 0.1
    lo, hi = wilson(24, 48)
    assert lo < 0.5 < hi and abs((0.5 - lo) - (hi - 0.5)) < 1e-3
    assert wilson(48, 48)[1] == 1.0


def _interval_ok(ci: list[float], p: float) -> bool:
    return len(ci) == 2 and 0.0 <= ci[0] <= p <= ci[1] <= 1.0


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.full  # the card's parts (rollout, train, regrade) each have their CI tests; this is the bench script's
def test_tiny_card(tiny_model, tmp_path):
    out = tmp_path / "card.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "real_model_learning.py"), "--tiny", "--model", tiny_model,
                           "--seeds", "0", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    card = json.loads(out.read_text())
    assert all(k in card for k in FIELDS), [k for k in FIELDS if k not in card]
    assert card["seeds"] == [0] and len(card["per_seed"]) == 1 and card["tiny"] is True
    assert len(card["model_sha256"]["model.safetensors_sha256"]) == 64 and len(card["recipe_sha256"]) == 64
    assert card["harness_version"]["agent_sha256"] and card["cpu"]["cores"] >= 1 and card["engine"]["name"]
    assert "real_model_learning.py" in card["command"] and "--tiny" in card["command"]
    for held in [card["heldout"], card["per_seed"][0]["heldout"]]:
        assert held["n"] == 4
        assert _interval_ok(held["before_ci"], held["before"]) and _interval_ok(held["after_ci"], held["after"])
    agreement = card["grader_agreement"]
    assert agreement["episodes"] > 0 and agreement["agreed"] + agreement["disagreements"] == agreement["episodes"]
    total = agreement["hrl_regrade_total"]  # `hrl regrade` replays each page's inputs: every episode agrees again
    assert total["regraded"] > 0 and total["agreed"] == total["regraded"], agreement["hrl_regrade"]
