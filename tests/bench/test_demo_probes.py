"""bench/demo_operators.py and bench/demo_reading.py: the fix classifier, and the teacher-forced operator probe on
the shipped tiny agent (batched scoring equals scoring one sequence at a time; probabilities over the 8 operators)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hrl.runners.tasks import load_tasks
from hrl.train.tiny.tasks import MIRROR, task_bug

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bug(op: str):
    task = next(t for t in load_tasks(ROOT / "recipes" / "demo" / "heldout.jsonl") if task_bug(t).op == op)
    return task, task_bug(task)


def test_the_classifier_names_each_kind_of_fix():
    classify = _bench("demo_operators").classify
    _, bug = _bug("+")  # the code has `-`, the fix writes `+`
    assert classify("sed -i 's/ - / + /' *.py", bug) == ("right", True)
    assert classify("sed 's/ - / + /' *.py", bug) == ("right", False)
    assert classify("sed -i 's/ - / - /' *.py", bug) == ("same", True)
    assert classify("sed -i 's/ - / * /' *.py", bug) == ("other", True)
    assert classify("sed -i 's/ + / - /' *.py", bug) == ("miss", True)
    assert classify("cat *.py", bug) == ("none", False)


@pytest.fixture(scope="module")
def probe_model():
    reading = _bench("demo_reading")
    model, tok = reading.load("")
    return reading, model, tok


def test_batched_scores_equal_one_sequence_at_a_time(probe_model):
    reading, model, tok = probe_model
    prefix = tok.encode("sed -i 's/", add_special_tokens=False)
    options = [tok.encode(f" {op} /", add_special_tokens=False) for op in MIRROR]
    batched = reading.scores(model, prefix, options)
    alone = [reading.scores(model, prefix, [o])[0] for o in options]
    assert batched == pytest.approx(alone, abs=1e-4)
    assert all(s < 0 for s in batched)


def test_the_probe_scores_an_episode_and_skips_one_without_sed(probe_model):
    reading, model, tok = probe_model
    task, bug = _bug("and")
    code = next(iter(task.repo_snapshot.values()))
    prompt = tok.encode(f"Fix the bug.\n{code}\n", add_special_tokens=False)
    sed = tok.encode("sed -i 's/ or / and /' *.py", add_special_tokens=False)
    trace = {"calls": [{"call_id": "c0", "prompt_ids": prompt, "response_ids": sed}]}
    row = reading.probe(json.loads(json.dumps(trace)), bug, model, tok)
    assert row is not None and row["bug"] == bug.bug == "or"
    assert 0 < row["p_pattern"] < 1 and 0 < row["p_replacement"] < 1
    assert isinstance(row["argmax_pattern"], bool)
    trace["calls"][0]["response_ids"] = tok.encode("cat *.py", add_special_tokens=False)
    assert reading.probe(trace, bug, model, tok) is None
