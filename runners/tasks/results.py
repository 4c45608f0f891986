"""Per-test outcomes from pytest's `-rA` short summary (the log format SWE-bench's harness parses too).

Summary lines look like `PASSED path::test[id]`, `FAILED path::test[id] - AssertionError: …`,
`ERROR path - ImportError …` (a collection error names the file). SKIPPED lines carry no node id and are ignored.
"""

from __future__ import annotations

import re

__all__ = ["PASSING", "failure_sections", "outcome", "parse_summary"]

PASSING = frozenset({"PASSED", "XFAIL"})  # XFAIL: an expected failure happened, the test "passes"
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)\s*$")
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_SECTION = re.compile(r"^={3,} ([A-Za-z ]+?) ={3,}$")


def parse_summary(output: str) -> dict[str, str]:
    """{node id: outcome} from `-rA` summary lines. A failed line also maps each `id - message` split, since a
    message follows the id after ' - ' (and ids may contain ' - ' themselves); exact ids win over splits."""
    exact: dict[str, str] = {}
    split: dict[str, str] = {}
    for line in output.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        status, rest = m.groups()
        if status not in PASSING or rest not in exact:  # PASSED then ERROR (at teardown): the error wins
            exact[rest] = status
        start = 0
        while (i := rest.find(" - ", start)) != -1:
            if status not in PASSING or rest[:i] not in split:
                split[rest[:i]] = status
            start = i + 1
    merged = {**split, **exact}
    for test_id, status in split.items():  # `PASSED x` then `ERROR x - teardown failed`: the error wins
        if status not in PASSING and merged[test_id] in PASSING:
            merged[test_id] = status
    return merged


def outcome(results: dict[str, str], test_id: str) -> str:
    """A listed test's outcome; a test that never ran (not collected, or its file failed to import) is MISSING.
    A collection error of the test's file counts for the test."""
    if test_id in results:
        return results[test_id]
    file = test_id.split("::", 1)[0]
    return "ERROR" if results.get(file) == "ERROR" else "MISSING"


def failure_sections(output: str) -> dict[str, str]:
    """{test headline: traceback text} from the FAILURES / ERRORS sections (for problem statements and logs)."""
    sections: dict[str, str] = {}
    current: str | None = None
    inside = False
    for line in output.splitlines():
        if m := _SECTION.match(line):
            inside = m.group(1) in ("FAILURES", "ERRORS")
            current = None
            continue
        if not inside:
            continue
        if m := _HEADER.match(line):
            current = m.group(1)
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections
