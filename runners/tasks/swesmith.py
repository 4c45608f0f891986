"""SWE-smith rows as tasks, graded the way the official `swesmith` package's harness grades them.

A SWE-smith row (`instance_id` `owner__repo.<commit8>.<bug>`, `repo` `swesmith/owner__repo.<commit8>`, `patch`,
`FAIL_TO_PASS`, `PASS_TO_PASS`, `image_name` `<org>/swesmith.x86_64.owner_1776_repo.<commit8>`) is not a SWE-bench
row: its `patch` *introduces* the bug, and its image holds the repository's clean state at `/testbed`. So:

- the task's base state is the image with `patch` applied (`bug_patch`); the gold fix is its reverse (`gold_patch`);
- grading re-checks out the FAIL_TO_PASS/PASS_TO_PASS test files (as the harness reverts them), then runs the
  repository profile's `get_test_cmd` between the `>>>>> Start/End Test Output` markers (the script shape of
  `swesmith.harness.utils.run_patch_in_container`), read by the profile's `log_parser`.

The profiles come from the `swesmith` package (`hrl[swebench]`; 0.0.9 installs without dependencies of its own
beyond `swebench`'s, about 0.3 MB). The official harness checks out the instance's branch from a GitHub mirror,
which needs the network; applying the row's `patch` to the clean image gives the same tree offline.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Any

from hrl.runners.errors import PrerequisiteError

__all__ = ["command", "files_under_test", "gold_patch", "is_smith_row", "parse_log", "profile_for", "reverse_diff"]

REPO_DIR = "/testbed"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
HINT = "pip install 'hrl[swebench]' (it brings the swesmith package and its repository profiles)"
_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def is_smith_row(row: dict[str, Any]) -> bool:
    """A SWE-smith row: hrl's own fields absent, and a SWE-smith repository or image named."""
    if row.get("grader") not in (None, "swesmith") or row.get("repo_snapshot") or row.get("test_cmd"):
        return False
    if row.get("grader") == "swesmith":
        return True
    return str(row.get("repo", "")).startswith("swesmith/") or ".swesmith." in f".{row.get('image_name', '')}"


@functools.cache
def _registry() -> Any:
    if importlib.util.find_spec("swesmith") is None:
        raise PrerequisiteError("SWE-smith rows need the swesmith package, which is not installed", hint=HINT)
    from swesmith.profiles import registry  # imports every language's profiles (~5 s)

    return registry


def profile_for(row: dict[str, Any]) -> Any:
    """The package's repository profile for the row (by `repo`, else by the instance id's repository part)."""
    key = str(row.get("repo") or row["instance_id"].rsplit(".", 1)[0])
    try:
        return _registry().get(key)
    except KeyError:
        try:
            return _registry().get(key.split("/", 1)[-1])
        except KeyError:
            raise PrerequisiteError(
                f"the swesmith package has no profile for {key}", hint="upgrade swesmith: pip install -U swesmith"
            ) from None


def _instance(task: Any) -> dict[str, Any]:
    row = task.model_dump(mode="json")
    return {**row, "FAIL_TO_PASS": list(task.FAIL_TO_PASS), "PASS_TO_PASS": list(task.PASS_TO_PASS)}


def files_under_test(task: Any, *, f2p_only: bool = False) -> list[str]:
    """The FAIL_TO_PASS and PASS_TO_PASS test files (FAIL_TO_PASS only with `f2p_only`), as the profile names them."""
    found = profile_for(_instance(task)).get_test_files(_instance(task))
    f2p, p2p = found if isinstance(found, tuple) else (found, [])
    return sorted(set(f2p) if f2p_only else set(f2p) | set(p2p))


def command(task: Any) -> str:
    """The grading script: test files as in the image, then the profile's test command between the markers."""
    instance = _instance(task)
    test_cmd, _ = profile_for(instance).get_test_cmd(instance)
    files = " ".join(files_under_test(task))
    reset = f"git checkout -- {files} 2>/dev/null || true" if files else "true"
    return (
        "\n".join(["exec 2>&1", "set -uxo pipefail", f"cd {REPO_DIR}", reset, f": '{START}'", test_cmd, f": '{END}'"])
        + "\n"
    )


def parse_log(task: Any, log: str) -> dict[str, str]:
    """{test id: PASSED | FAILED | …} from the test output between the markers, by the profile's log parser."""
    if START in log and END in log:
        log = log.split(START, 1)[1].split(END, 1)[0]
    results: dict[str, str] = profile_for(_instance(task)).log_parser(log)
    return results


def gold_patch(task: Any) -> str:
    """The fix: the reverse of the row's bug `patch`."""
    return reverse_diff(task.patch)


def reverse_diff(diff: str) -> str:
    """A unified git diff undone: old and new sides swapped, file creation and deletion included."""
    out: list[str] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.rstrip("\n")
        if body.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            out += ["--- " + _side(lines[i + 1][4:], "a/"), "+++ " + _side(line[4:], "b/")]
            i += 2
            continue
        m = _HUNK.match(body)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}\n")
            i += 1
            minus: list[str] = []
            plus: list[str] = []
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", "\\", "\n"):
                cur = lines[i]
                if cur.startswith("-"):
                    minus.append("+" + cur[1:])
                elif cur.startswith("+"):
                    plus.append("-" + cur[1:])
                elif cur.startswith("\\") and (minus or plus):
                    (plus if lines[i - 1].startswith("+") else minus).append(cur)
                else:
                    out += plus + minus + [cur]
                    minus, plus = [], []
                i += 1
            out += plus + minus
            continue
        if body.startswith("new file mode "):
            out.append("deleted file mode " + line[len("new file mode ") :])
        elif body.startswith("deleted file mode "):
            out.append("new file mode " + line[len("deleted file mode ") :])
        elif body.startswith("index ") and ".." in body:
            ids, _, mode = body[6:].partition(" ")
            a, b = ids.split("..", 1)
            out.append(f"index {b}..{a}{' ' + mode if mode else ''}\n")
        else:
            out.append(line)
        i += 1
    return "".join(out)


def _side(name: str, prefix: str) -> str:
    """A file name of the other side of a diff, under that side's `a/` or `b/` prefix."""
    return prefix + name[2:] if name[:2] in ("a/", "b/") else name
