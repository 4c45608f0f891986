"""Source distributions for task synthesis: download one with pip, read its files, tell code from tests.

A package qualifies when its sdist is pure Python and carries its tests. Tests are every file under a directory
named `test`/`tests`/`testing`, plus `test_*.py`, `*_test.py` and `conftest.py` anywhere; they become the hidden
test patch. Left out of the repository snapshot (not needed to fix bugs, and they would bloat the task file):
`*.egg-info`, `docs/`, `doc/`, `.github/`, benchmarks, examples, PKG-INFO and changelogs at the root, files over
200 kB and files that are not UTF-8 text.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hrl.runners.errors import HrlError

__all__ = ["SdistError", "SourceTree", "download_sdist", "read_sdist"]

TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_FILES = ("test_*.py", "*_test.py", "conftest.py")
SKIP_FILES = ("PKG-INFO", "CHANGELOG*", "CHANGES*", "HISTORY*", "NEWS*")  # at the root: duplicates or history
SKIP_DIRS = frozenset({"docs", "doc", ".github", "benchmark", "benchmarks", "bench", "changelog.d", "examples"})
NOT_SOURCE = frozenset({"setup.py", "noxfile.py", "conftest.py", "fabfile.py", "tasks.py", "_version.py"})
MAX_FILE_BYTES = 200_000


class SdistError(HrlError):
    """An sdist could not be downloaded, or does not suit task synthesis."""


@dataclass
class SourceTree:
    name: str  # distribution name as given
    version: str
    files: dict[str, str]  # every kept file (code, tests, config), relative path -> text
    import_root: str  # "src" for a src layout, else "."

    def is_test(self, path: str) -> bool:
        parts = path.split("/")
        return bool(TEST_DIRS.intersection(parts[:-1])) or any(fnmatch.fnmatchcase(parts[-1], g) for g in TEST_FILES)

    @property
    def test_modules(self) -> list[str]:
        """Test files pytest collects by default (test_*.py, *_test.py)."""
        names = TEST_FILES[:2]
        return sorted(p for p in self.files if any(fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], g) for g in names))

    @property
    def source_modules(self) -> list[str]:
        """The package's own modules: .py files under the import root, outside tests, scripts and setup files."""
        out = []
        root = "" if self.import_root == "." else self.import_root + "/"
        for path in sorted(self.files):
            rel = path[len(root) :] if path.startswith(root) else None
            if rel is None or not path.endswith(".py") or self.is_test(path) or rel.split("/")[-1] in NOT_SOURCE:
                continue
            top = rel.split("/")[0]
            if "/" in rel and f"{root}{top}/__init__.py" not in self.files:
                continue  # a plain directory (scripts, tools), not a package
            out.append(path)
        return out


def download_sdist(package: str, version: str | None, dest: Path, timeout_s: float = 600) -> Path:
    """`pip download --no-deps --no-binary :all: NAME[==V]` into dest; returns the sdist's path."""
    spec = f"{package}=={version}" if version else package
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(dest), spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SdistError(f"pip download {spec} failed: {exc}") from exc
    found = sorted(p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tar.bz2")))
    if proc.returncode != 0 or not found:
        raise SdistError(
            f"no source distribution of {spec}: {(proc.stderr or proc.stdout).strip()[-800:]}",
            hint="check the name and version on PyPI; only packages with an sdist qualify",
        )
    return found[0]


def read_sdist(path: Path, package: str | None = None) -> SourceTree:
    """Read an sdist archive into a SourceTree (its top directory stripped)."""
    raw = _archive_files(path)
    tops = {name.split("/", 1)[0] for name in raw}
    strip = len(tops) == 1 and all("/" in name for name in raw)
    files: dict[str, str] = {}
    for name, data in raw.items():
        rel = name.split("/", 1)[1] if strip else name
        parts = rel.split("/")
        if (
            SKIP_DIRS.intersection(parts[:-1])
            or any(p.endswith(".egg-info") for p in parts)
            or len(data) > MAX_FILE_BYTES
            or (len(parts) == 1 and any(fnmatch.fnmatchcase(rel, g) for g in SKIP_FILES))
        ):
            continue
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    stem = path.name
    for suffix in (".tar.gz", ".tar.bz2", ".zip"):
        stem = stem.removesuffix(suffix)
    match = re.match(r"^(.+?)-(\d[^-]*)$", stem)
    name, version = (match.group(1), match.group(2)) if match else (stem, "0")
    src = any(p.startswith("src/") and p.endswith("/__init__.py") for p in files)
    tree = SourceTree(package or name, version, files, "src" if src else ".")
    if not tree.test_modules:
        raise SdistError(
            f"{path.name} carries no tests (no test_*.py files)", hint="pick a package whose sdist ships its tests"
        )
    if not tree.source_modules:
        raise SdistError(f"{path.name} holds no Python modules to mutate")
    return tree


def _archive_files(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    out[info.filename] = zf.read(info)
        return out
    with tarfile.open(path) as tar:
        for member in tar:
            if member.isfile() and not member.name.startswith("/") and ".." not in member.name.split("/"):
                extracted = tar.extractfile(member)
                if extracted is not None:
                    out[member.name.removeprefix("./")] = extracted.read()
    return out
