"""The trace reader (`runners/trace.py`): every line it cannot read is named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrl.runners.trace import TraceFormatError, read_trace_file, read_traces

TRACE = {
    "schema": "hrl.trace/1", "trace_id": "a1b2c3d4", "session": "s", "task_id": "t1", "status": "ok",
    "failure_reason": None, "reward": 1.0, "calls": [], "started_at": 0.0, "ended_at": 1.0,
    "metadata": {"note": "café"},
}  # fmt: skip


def test_a_binary_file_is_named_with_its_line(tmp_path: Path):
    """Before, a binary file gave `'utf-8' codec can't decode byte …` naming no file (and "a bug in hrl")."""
    path = tmp_path / "model.bin"
    path.write_bytes(json.dumps(TRACE).encode() + b"\n" + bytes(range(128, 256)) + b"\n")
    with pytest.raises(TraceFormatError, match=r"model\.bin:2: not a valid hrl\.trace/1 trace: not UTF-8 text"):
        list(read_traces(path))
    with pytest.raises(TraceFormatError, match=r"model\.bin:2: .*not UTF-8"):  # a reader of crashed runs too
        read_trace_file(path)


def test_a_last_line_cut_inside_a_character_is_a_cut_line(tmp_path: Path):
    """A writer killed mid-write can stop inside a multi-byte character: that is a line cut short, not damage."""
    line = json.dumps(TRACE, ensure_ascii=False).encode()
    path = tmp_path / "traces.jsonl"
    path.write_bytes(line + b"\n" + line[: line.index("é".encode()) + 1])
    found = read_trace_file(path)
    assert len(found.traces) == 1 and found.cut_line == 2
    with pytest.raises(TraceFormatError, match=r"traces\.jsonl:2: .*not UTF-8"):  # without on_cut, it raises
        list(read_traces(path))
