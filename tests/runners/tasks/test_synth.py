"""`hrl tasks synth` on a suite too weak to guard its package: refused before a single mutant runs, naming each
problem (the tests kept, the test files that do not import and why); told to warn, the tasks are written, the
problems said and recorded for `hrl tasks check`. A suite strong enough keeps no task without a PASS_TO_PASS test.
In the grading image (Docker); the jmespath case, as a new user met it, from PyPI."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.tasks.suite import SuiteConfig, WeakSuiteError, task_problems
from hrl.runners.tasks.synth import SynthConfig, synthesize

pytestmark = pytest.mark.docker

CODE = (
    "def mean(xs):\n    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n\n\n"
    "def clip(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n\n\n"
    "def words(text):\n    out = []\n    for w in text.split():\n        if w:\n            out.append(w.lower())\n"
    "    return out\n"
)
STATS = (
    "from small import clip, mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\n"
    "def test_mean_empty():\n    assert mean([]) == 0.0\n\n\ndef test_clip():\n    assert clip(5, 0, 3) == 3\n"
    "    assert clip(-1, 0, 3) == 0\n    assert clip(2, 0, 3) == 2\n"
)
WORDS = "from small import words\n\n\ndef test_words():\n    assert words('A b  C') == ['a', 'b', 'c']\n"
# jmespath 1.1.0's sdist: its test files import helpers from a `tests` package whose __init__.py it does not ship
BROKEN = "from tests import unittest\n\nfrom small import clip\n\n\ndef test_clip():\n    assert clip(5, 0, 3) == 3\n"
SLACK = {"max_test_file_s": 600, "max_task_test_s": 600}  # timing never decides here (a loaded machine)


def make_sdist(path: Path, tests: dict[str, str]) -> Path:
    files = {"setup.py": "", "small/__init__.py": CODE, **tests}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"small-0.1/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def weak_sdist(tmp_path: Path) -> Path:
    tests = {"tests/test_stats.py": STATS, "tests/test_lexer.py": BROKEN, "tests/test_parser.py": BROKEN}
    return make_sdist(tmp_path / "small-0.1.tar.gz", tests)


def test_a_weak_suite_is_refused_before_any_mutant(swe_image: str, tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    with pytest.raises(WeakSuiteError) as caught:
        synthesize("small", n=3, sdist=weak_sdist(tmp_path), out=tmp_path / "o.jsonl", config=SynthConfig(**SLACK),
                   on_event=events.append)  # fmt: skip
    message = str(caught.value)
    assert message.startswith("small 0.1: its test suite is too weak to guard the package: ")
    assert "the kept suite holds 3 tests (min_tests=20)" in message
    assert "2 of 3 test files do not run at baseline (max_unusable_files=0.5)" in message
    assert "tests/test_lexer.py: does not import: ImportError: cannot import name 'unittest' from 'tests'" in message
    assert "--allow-weak-suite" in (caught.value.hint or "")
    assert not any(e["event"] == "synth_mutant" for e in events) and not (tmp_path / "o.jsonl").exists()
    [suite] = [e for e in events if e["event"] == "synth_suite"]
    assert (suite["test_files"], suite["tests"], sorted(suite["unusable"])) == (
        3, 3, ["tests/test_lexer.py", "tests/test_parser.py"]
    )  # fmt: skip


def test_told_to_warn_it_writes_the_tasks_and_records_the_problems(swe_image: str, tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    config = SynthConfig(**SLACK, weak_suite="warn")
    tasks = synthesize("small", n=1, sdist=weak_sdist(tmp_path), config=config, on_event=events.append)
    assert len(tasks) == 1
    [suite] = [e for e in events if e["event"] == "synth_suite"]
    assert len(suite["problems"]) == 2
    record = tasks[0].synth["suite"]  # type: ignore[attr-defined]
    assert record["tests"] == 3 and record["limits"] == SuiteConfig().model_dump()
    assert task_problems(tasks)[tasks[0].instance_id][:2] == suite["problems"]  # what `hrl tasks check` will say


def test_a_sound_suite_keeps_no_task_without_pass_to_pass(swe_image: str, tmp_path: Path) -> None:
    """test_words.py holds one test: a bug in words() breaks all of its file, so its task would list no
    PASS_TO_PASS test. Such mutants are skipped; every task kept has one."""
    sdist = make_sdist(tmp_path / "small-0.1.tar.gz", {"tests/test_stats.py": STATS, "tests/test_words.py": WORDS})
    events: list[dict[str, Any]] = []
    config = SynthConfig(**SLACK, suite=SuiteConfig(min_tests=4))
    tasks = synthesize("small", n=10, sdist=sdist, config=config, on_event=events.append)
    skipped = [e["why"] for e in events if e["event"] == "synth_skipped"]
    assert any(why.startswith("0 PASS_TO_PASS tests (min_pass_to_pass=1)") for why in skipped), events
    assert tasks and all(t.PASS_TO_PASS for t in tasks)
    assert task_problems(tasks) == {}


@pytest.mark.slow
def test_jmespath_from_pypi_is_refused(swe_image: str, tmp_path: Path) -> None:
    """The new user's case: 5 of jmespath 1.1.0's 6 test files fail to import; the 10 tasks it made looked fine."""
    with pytest.raises(WeakSuiteError) as caught:
        synthesize("jmespath", "1.1.0", n=10, out=tmp_path / "jm.jsonl")
    assert "the kept suite holds 1 test (min_tests=20)" in str(caught.value)
    assert "5 of 6 test files do not run at baseline" in str(caught.value)
    assert not (tmp_path / "jm.jsonl").exists()
