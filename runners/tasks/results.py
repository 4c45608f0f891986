"""Per-test outcomes from pytest's `-rA` short summary (the log format SWE-bench's harness parses too).

Summary lines look like `PASSED path::test[id]`, `FAILED path::test[id] - AssertionError: …`,
`ERROR path - ImportError …` (a collection error names the file). A summary's SKIPPED line carries no node id, only
where the skip was raised (`SKIPPED [1] path:line: reason`: `skip_locations`); the node id of a skipped test comes
from pytest's `-v` progress line (`path::test SKIPPED (reason) [ 50%]`), which hrl's own test command asks for.
"""

from __future__ import annotations

import re

__all__ = ["PASSING", "failure_sections", "outcome", "parse_summary", "skip_locations"]

PASSING = frozenset({"PASSED", "XFAIL"})  # XFAIL: an expected failure happened, the test "passes"
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)\s*$")
_VERBOSE_SKIP = re.compile(r"^(\S+::.*?) SKIPPED(?: \(.*\))?(?:\s+\[\s*\d+%\])?\s*$")
_SKIP_WHERE = re.compile(r"^SKIPPED \[\d+\] (.+?):\d+: ")
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
    for line in output.splitlines():  # `-v`: a skipped test's id (the summary's own lines win)
        if (m := _VERBOSE_SKIP.match(line)) and m.group(1) not in merged:
            merged[m.group(1)] = "SKIPPED"
    return merged


def skip_locations(output: str) -> set[str]:
    """The files skips were raised in, from the summary's `SKIPPED [n] path:line: reason` lines: a test's own
    file for a skip mark, the code under test when that code calls `pytest.skip`."""
    return {m.group(1) for line in output.splitlines() if (m := _SKIP_WHERE.match(line))}


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
