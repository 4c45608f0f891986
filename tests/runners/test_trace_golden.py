"""The trace contract pinned by committed files: each golden `hrl.trace/1` file (one per dialect, streaming and
not, with a branch, a side call and a response sampled across a publish) reads and validates, re-encodes to the
same bytes, and gives the same samples and the same loss as when it was written (`python -m tests.golden.make`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrl.runners.trace import encode_trace, read_traces
from hrl.train.samples import build_samples
from tests.golden.expected import batch_loss, describe_samples

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FILES = sorted(GOLDEN.glob("*.jsonl"))
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def test_there_is_a_golden_file_per_dialect_and_mode():
    assert [f.stem for f in FILES] == [f"{d}-{m}" for d in ("anthropic", "chat", "gemini", "responses")
                                       for m in ("json", "sse")]  # fmt: skip
    assert set(EXPECTED["files"]) == {f.name for f in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_golden_trace_reads_and_reencodes_byte_for_byte(path):
    lines = path.read_text().splitlines(keepends=True)
    traces = list(read_traces(path))
    assert len(traces) == len(lines) == 1
    assert encode_trace(traces[0]) == lines[0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_golden_trace_gives_the_same_samples(path):
    (trace,) = read_traces(path)
    want = EXPECTED["files"][path.name]
    assert describe_samples(build_samples(trace)) == want["samples"]
    assert describe_samples(build_samples(trace, include_side=True)) == want["samples_with_side"]


def test_golden_traces_cover_branches_side_calls_and_versions():
    traces = [t for f in FILES for t in read_traces(f)]
    calls = [c for t in traces for c in t["calls"]]
    assert any(len(c["versions"]) > 1 for c in calls), "a response sampled across a publish"
    assert any(c["side"] for c in calls)
    parents = [c.get("parent") for c in calls if c.get("parent")]
    assert len(parents) > len(set(parents)), "a call with two children (a branch)"


def test_golden_traces_give_the_same_loss():
    assert batch_loss(FILES) == pytest.approx(EXPECTED["batch_loss"], abs=1e-9)
