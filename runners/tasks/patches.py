"""Unified (git) diffs: write one per file, split one into its files, and name the paths it touches.

Only what the verifier and the synthesizer need: diffs are applied inside sandboxes with `git apply`, never here.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = ["FilePatch", "file_diff", "join_patches", "patch_paths", "split_patch"]

NO_NEWLINE = "\\ No newline at end of file\n"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the repository root
    text: str  # this file's part of the diff, header included
    kind: str  # "new", "deleted" or "modified" (mode changes and binary patches count as "modified")


def file_diff(path: str, old: str | None, new: str | None, context: int = 3) -> str:
    """A git-style diff turning text `old` into `new` at `path` (None: the file does not exist)."""
    if old == new:
        return ""
    head = f"diff --git a/{path} b/{path}\n"
    if old is None:
        head += "new file mode 100644\n"
    elif new is None:
        head += "deleted file mode 100644\n"
    a, b = (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True)
    if not a and not b:
        return head  # an empty file created or deleted: git writes no hunk
    lines = difflib.unified_diff(
        a,
        b,
        "/dev/null" if old is None else f"a/{path}",
        "/dev/null" if new is None else f"b/{path}",
        n=context,
        lineterm="\n",
    )
    body = []
    for line in lines:
        body.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return head + "".join(body)


def join_patches(parts: list[str]) -> str:
    return "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)


def split_patch(diff: str) -> list[FilePatch]:
    """The per-file parts of a git diff (sections starting `diff --git`); text before the first is dropped."""
    sections: list[list[str]] = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git ") or not sections:
            sections.append([])
        sections[-1].append(line)
    out = []
    for lines in sections:
        if not lines or not lines[0].startswith("diff --git "):
            continue
        path = _header_path(lines)
        head = "".join(lines[:4])
        kind = "new" if "\nnew file mode" in head else "deleted" if "\ndeleted file mode" in head else "modified"
        out.append(FilePatch(path, "".join(lines), kind))
    return out


def patch_paths(diff: str) -> list[str]:
    """Every path a diff touches (git format; falls back to `+++`/`---` lines for plain unified diffs)."""
    parts = split_patch(diff)
    if parts:
        return [p.path for p in parts]
    paths = []
    for line in diff.splitlines():
        if line.startswith(("+++ ", "--- ")):
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                name = name[2:] if name.startswith(("a/", "b/")) else name
                if name not in paths:
                    paths.append(name)
    return paths


def _header_path(lines: list[str]) -> str:
    """The path of one file's section. Prefers the ---/+++ lines; else splits `diff --git a/P b/P` (no renames)."""
    for line in lines[1:8]:
        if line.startswith(("+++ ", "--- ")):
            name = _unquote(line[4:].rstrip("\n"))
            if name != "/dev/null":
                return name[2:] if name.startswith(("a/", "b/")) else name
        if line.startswith("@@"):
            break
    rest = lines[0][len("diff --git ") :].rstrip("\n")
    if rest.startswith('"'):
        match = re.match(r'("(?:[^"\\]|\\.)*")', rest)
        return _unquote(match.group(1))[2:] if match else rest
    half = (len(rest) - 1) // 2  # "a/P b/P": both halves are the same path when there are no renames
    return rest[2:half] if rest[half] == " " else rest.split(" b/", 1)[0][2:]


def _unquote(name: str) -> str:
    """Undo git's C-style quoting of unusual paths (`"a/t\\303\\251st"`)."""
    if not (name.startswith('"') and name.endswith('"')):
        return name
    out, raw, i, body = [], bytearray(), 0, name[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567":
                raw.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            raw += _ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        raw += ch.encode()
        i += 1
    out.append(raw.decode("utf-8", "replace"))
    return "".join(out)
