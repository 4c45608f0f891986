"""R2E-Gym's own rows as tasks, graded the way R2E-Gym grades them.

An R2E-Gym row (`R2E-Gym/R2E-Gym-*`: `repo_name`, `docker_image`, `commit_hash`, `parsed_commit_content`,
`execution_result_content`, `expected_output_json`, `problem_statement`, …; no `instance_id`, no FAIL_TO_PASS) names
an image whose `/testbed` holds the repository before the commit (with its `.venv`), the instance's test script at
`/testbed/run_tests.sh` and its tests at `/r2e_tests`. As R2E-Gym's `DockerRuntime` does:

- the agent never sees the test script, the tests or the instance files R2E-Gym hides (`SKIP_FILES`): they are
  removed from the agent's sandbox;
- grading links `/r2e_tests` at `/testbed/r2e_tests`, runs `bash run_tests.sh` in `/testbed`, reads the log with
  R2E-Gym's pytest parser (every repository it supports uses it), strips colour codes and ` - reason` suffixes, and
  scores 1 only when the parsed outcomes are exactly `expected_output_json` (same tests, same status each), else 0;
- the gold (`patch`, when a row carries none) is the commit's non-test Python file diffs from
  `parsed_commit_content`, as R2E-Gym's `ParsedCommit.get_patch(test_file=False)` writes them.

`instance_id` is `<repo_name>__<commit_hash>` when the row has none; FAIL_TO_PASS lists the expected tests.
R2E-Gym's package is not on PyPI; the few pieces grading needs are written here after its source.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["adapt", "command", "expected", "gold_from_commit", "is_r2e_row", "parse_log", "score"]

REPO_DIR = "/testbed"
TESTS_DIR = "/r2e_tests"
# R2E-Gym's agenthub SKIP_FILES: the instance's files it keeps from the agent.
SKIP_FILES = (
    "run_tests.sh", "syn_issue.json", "expected_test_output.json", "execution_result.json", "parsed_commit.json",
    "modified_files.json", "modified_entities.json", "r2e_tests",
)  # fmt: skip
_COLOUR = re.compile(r"\x1b\[\d+m")


def is_r2e_row(row: dict[str, Any]) -> bool:
    """An R2E-Gym row: its expected test output and image, and none of hrl's or SWE-bench's grading fields."""
    if row.get("grader") not in (None, "r2egym") or row.get("repo_snapshot") or row.get("test_cmd"):
        return False
    return row.get("grader") == "r2egym" or bool(
        row.get("expected_output_json") and row.get("docker_image") and not row.get("FAIL_TO_PASS")
    )


def adapt(row: dict[str, Any]) -> dict[str, Any]:
    """The row with hrl's task fields filled in from R2E-Gym's (the row's own fields are kept)."""
    out = {**row, "grader": "r2egym", "image": row.get("image") or row.get("docker_image")}
    out.setdefault("instance_id", f"{row.get('repo_name', 'r2e')}__{row.get('commit_hash', '')}".rstrip("_"))
    out.setdefault("repo", row.get("repo_name", ""))
    if not out.get("patch") and row.get("parsed_commit_content"):
        out["patch"] = gold_from_commit(row["parsed_commit_content"])
    out["FAIL_TO_PASS"] = sorted(expected(out))
    out.setdefault("PASS_TO_PASS", [])
    return out


def expected(row: Any) -> dict[str, str]:
    """{test: status} the dataset expects (colour codes and ` - ` suffixes stripped, as R2E-Gym compares)."""
    raw = (
        row.get("expected_output_json")
        if isinstance(row, dict)
        else (row.model_extra or {}).get("expected_output_json")
    )
    data = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    return _normalise(data)


def _normalise(results: dict[str, str]) -> dict[str, str]:
    return {_COLOUR.sub("", k).split(" - ")[0]: v for k, v in sorted(results.items())}


def command(task: Any) -> str:
    """R2E-Gym's test run: its tests linked into the repository, its script run there, one stream."""
    return "\n".join(
        [
            "exec 2>&1", f"cd {REPO_DIR}", f"rm -rf r2e_tests && ln -s {TESTS_DIR} r2e_tests",
            "git checkout -q HEAD -- run_tests.sh 2>/dev/null || true", "bash run_tests.sh",
        ]
    ) + "\n"  # fmt: skip


def parse_log(task: Any, log: str) -> dict[str, str]:
    """R2E-Gym's `parse_log_pytest`: the `short test summary info` lines, `file::Class::test` read `Class.test`."""
    results: dict[str, str] = {}
    if "short test summary info" not in log:
        return results
    for line in log.split("short test summary info")[1].strip().split("\n"):
        name = ".".join(line.split("::")[1:])
        for status in ("PASSED", "FAILED", "ERROR"):
            if status in line:
                results[name if status == "PASSED" else name.split(" - ")[0]] = status
                break
    return _normalise(results)


def score(task: Any, results: dict[str, str]) -> tuple[float, int]:
    """(1.0 when the parsed outcomes are exactly the expected ones else 0.0, how many tests match)."""
    want = expected(task.model_dump(mode="json"))
    got = _normalise(results)
    matching = sum(got.get(t) == s for t, s in want.items())
    return float(len(got) == len(want) and matching == len(want)), matching


def hidden_script() -> str:
    """Bash (at the repository) that removes what the agent must not see."""
    files = " ".join(SKIP_FILES)
    return f"rm -rf -- {files} {TESTS_DIR} 2>/dev/null || true\n"


def gold_from_commit(parsed_commit: str | dict[str, Any]) -> str:
    """The non-test Python file diffs of R2E-Gym's parsed commit, as `ParsedCommit.get_patch(test_file=False)`."""
    commit = json.loads(parsed_commit) if isinstance(parsed_commit, str) else parsed_commit
    return "".join(_file_patch(d) for d in commit.get("file_diffs", []) if _wanted(d["header"]["file"]["path"]))


def _wanted(path: str) -> bool:
    parts = path.split("/")
    test = (
        path.endswith("_test.py") or path.startswith("test_") or parts[-1].startswith("test_")
        or any(p in parts for p in ("tests", "Tests", "test", "Test"))
    )  # fmt: skip
    return path.endswith(".py") and not test


def _file_patch(d: dict[str, Any]) -> str:
    path = d["header"]["file"]["path"]
    out = f"diff --git a/{path} b/{path}\n"
    if d["header"].get("misc_line"):
        out += d["header"]["misc_line"] + "\n"
    if d.get("index_line"):
        i = d["index_line"]
        out += (
            f"index {i['old_commit_hash']}..{i['new_commit_hash']}{' ' if i.get('mode') else ''}{i.get('mode', '')}\n"
        )
    if d.get("is_binary_file"):
        out += (d.get("binary_line") or "") + "\n"
    if d.get("minus_file") and d.get("plus_file"):
        out += f"--- {d['minus_file']['path']}\n+++ {d['plus_file']['path']}\n"
    marks = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}
    for hunk in d.get("hunks", []):
        desc = hunk["descriptor"]

        def rng(r: dict[str, Any]) -> str:
            return f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"

        out += f"@@ -{rng(desc['old_range'])} +{rng(desc['new_range'])} @@"
        out += f" {desc['section']}\n" if desc.get("section") else "\n"
        for line in hunk["line_group"]["all_lines"]:
            out += f"{marks[line['type']]}{line['content']}\n"
    return out
