"""README "First ten minutes" stays true: every `$ hrl …` line of its console blocks is run, in order, in one
scratch folder, and each line shown under it must appear in what the command printed (stdout and stderr), in
that order; `…` matches anything. The rollout step runs a real agent CLI (mini-swe-agent), hence the marker.
The README stays short, and the docs stay reachable: docs/README.md lists every page, and no relative link is
broken.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def steps() -> list[tuple[str, list[str]]]:
    """(command after `hrl`, the lines it is shown to print) for every `$ hrl` line of the section."""
    text = README.read_text()
    section = text.split("## First ten minutes", 1)[1].split("\n## ", 1)[0]
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.startswith("$ hrl "):
                found.append((line.removeprefix("$ hrl "), []))
            elif line.strip():
                found[-1][1].append(line.rstrip())
    return found


def _pattern(shown: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in shown.split("…")))


def test_the_section_has_the_steps_a_newcomer_needs():
    commands = [cmd.split()[0] for cmd, _ in steps()]
    assert {"recipes", "models", "rollout", "inspect", "report"} <= set(commands), commands
    assert all(shown for _, shown in steps())  # every step says what it prints


@pytest.mark.agents
def test_first_ten_minutes_prints_what_the_readme_shows(tmp_path: Path):
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    for command, shown in steps():
        out = subprocess.run(
            [sys.executable, "-m", "hrl.cli", *shlex.split(command)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        printed = (out.stdout + out.stderr).splitlines()
        assert "Traceback" not in out.stderr, out.stderr
        at = 0
        for line in shown:
            pattern = _pattern(line)
            hits = [i for i in range(at, len(printed)) if pattern.fullmatch(printed[i].rstrip())]
            assert hits, f"`hrl {command}` did not print {line!r} (after line {at}):\n" + "\n".join(printed)
            at = hits[0] + 1


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; details belong in docs/"


def _relative_links(page: Path) -> list[str]:
    """Targets of the page's markdown links outside code, less web addresses and `#anchors`."""
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    return [t for t in targets if t and not re.match(r"[a-z][a-z+.-]*:", t)]


def test_docs_index_lists_every_page_and_every_relative_link_resolves():
    index = DOCS / "README.md"
    listed = {(DOCS / t).resolve() for t in _relative_links(index)}
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.resolve() not in listed]
    assert not unlisted, f"docs/README.md does not link {unlisted}"
    broken = [
        f"{page.relative_to(ROOT)} → {target}"
        for page in [README, *sorted(DOCS.glob("*.md"))]
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, broken
