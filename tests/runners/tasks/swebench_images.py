"""SWE-bench-format instances of three repositories with different test runners, and their images built here.

Each image has the layout of an official SWE-bench instance image, built from hrl's base image: the repository at
/testbed (a base commit, then the install step's `SWE-bench` commit on top), and the environment its eval script
activates (`source /opt/miniconda3/bin/activate; conda activate testbed`: a venv at /opt/miniconda3/envs/testbed,
entered by a two-line `conda` stand-in). Packages come from PyPI as wheels downloaded on the host; the venv's pip
reads only those (no network when grading), so the install step of the eval script runs offline.

- `pallets/flask` 2.3: a small package under pytest (`pytest -rA`, parser `parse_log_flask`).
- `django/django` 5.0: real Django; `tests/runtests.py` runs the repository's tests with Django's own test runner
  (`--verbosity 2 --settings=test_sqlite --parallel 1`, parser `parse_log_django`).
- `sympy/sympy` 1.13: real SymPy; `bin/test` runs the repository's tests with SymPy's own runner
  (`-C --verbose`, parser `parse_log_sympy`).

Images are tagged with the official names (`swebench/sweb.eval.x86_64.<id>`) and cached by a hash of what goes in.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrl.runners.tasks.patches import file_diff, join_patches
from hrl.runners.tasks.swebench import image_for

BASE_IMAGE = "hrl/base:bookworm"
LABEL = "hrl.test.swebench"
ACTIVATE = """\
# conda's activate as far as SWE-bench eval scripts use it: `conda activate NAME` enters /opt/miniconda3/envs/NAME
conda() { if [ "$1" = activate ]; then . "/opt/miniconda3/envs/$2/bin/activate"; else return 1; fi; }
"""
DOCKERFILE = """\
FROM {base}
COPY wheels /opt/wheels
COPY activate /opt/miniconda3/bin/activate
COPY repo /testbed
RUN python3 -m venv /opt/miniconda3/envs/testbed \\
 && printf '[global]\\nno-index = true\\nfind-links = /opt/wheels\\nno-build-isolation = false\\n' \\
    > /opt/miniconda3/envs/testbed/pip.conf \\
 && /opt/miniconda3/envs/testbed/bin/pip install -q --no-compile {packages} \\
 && cd /testbed && {chmod}git init -q && git add -A \\
 && git -c user.name=SWE-bench -c user.email=setup@swebench.config commit -q -m base \\
 && . /opt/miniconda3/bin/activate && conda activate testbed && {install} \\
 && git -c user.name=SWE-bench -c user.email=setup@swebench.config commit -q --allow-empty -am SWE-bench
LABEL {label}="{digest}"
"""


@dataclass
class Fixture:
    """One instance: its repository, the fix, the hidden tests, and how its image is made."""

    instance_id: str
    repo: str
    version: str
    files: dict[str, str]  # the base state
    fixed: dict[str, str]  # files the gold patch changes, as they are after it
    tests: dict[str, str]  # files the test patch changes, as they are after it
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    packages: list[str]
    install: str = "python -m pip install -e ."
    executables: list[str] = field(default_factory=list)

    def patch(self, new: dict[str, str]) -> str:
        return join_patches([file_diff(p, self.files.get(p), text) for p, text in sorted(new.items())])

    def row(self, base_commit: str) -> dict[str, Any]:
        """The instance as a SWE-bench dataset row (test lists as JSON strings, as the datasets store them)."""
        return {
            "repo": self.repo, "instance_id": self.instance_id, "base_commit": base_commit,
            "patch": self.patch(self.fixed), "test_patch": self.patch(self.tests),
            "problem_statement": f"{self.instance_id}: see the failing behaviour described by its tests.",
            "hints_text": "", "created_at": "2020-01-01T00:00:00Z", "version": self.version,
            "FAIL_TO_PASS": json.dumps(self.fail_to_pass), "PASS_TO_PASS": json.dumps(self.pass_to_pass),
            "environment_setup_commit": base_commit,
        }  # fmt: skip

    def dockerfile(self, digest: str) -> str:
        return DOCKERFILE.format(
            base=BASE_IMAGE, packages=" ".join(self.packages), install=self.install, label=LABEL, digest=digest,
            chmod=f"chmod +x {' '.join(self.executables)} && " if self.executables else "",
        )  # fmt: skip

    def digest(self) -> str:
        parts = [BASE_IMAGE, DOCKERFILE, ACTIVATE, self.install, *self.packages, *self.executables]
        parts += [f"{k}\0{v}" for k, v in sorted(self.files.items())]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]

    @property
    def image(self) -> str:
        return image_for({"instance_id": self.instance_id, "repo": self.repo, "version": self.version})


PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1"

[tool.setuptools]
packages = ["{name}"]
"""

FLASK = Fixture(
    instance_id="pallets__flask-90001",
    repo="pallets/flask",
    version="2.3",
    files={
        "pyproject.toml": PYPROJECT.format(name="slugkit"),
        "slugkit/__init__.py": 'def slugify(text):\n    return "-".join(text.split())\n',
        "tests/test_slugkit.py": 'from slugkit import slugify\n\n\ndef test_spaces():\n    assert slugify("a b") == "a-b"\n',
    },
    fixed={"slugkit/__init__.py": 'def slugify(text):\n    return "-".join(text.lower().split())\n'},
    tests={
        "tests/test_slugkit.py": 'from slugkit import slugify\n\n\ndef test_spaces():\n    assert slugify("a b") == "a-b"\n'
        '\n\ndef test_lower():\n    assert slugify("A B") == "a-b"\n'
    },
    fail_to_pass=["tests/test_slugkit.py::test_lower"],
    pass_to_pass=["tests/test_slugkit.py::test_spaces"],
    packages=["pytest==8.4.2", "setuptools==80.9.0"],
)

DJANGO_RUNTESTS = """\
#!/usr/bin/env python
import argparse
import os
import sys

import django
from django.conf import settings
from django.test.utils import get_runner

parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings", default="test_sqlite")
parser.add_argument("--parallel", type=int, default=1)
args = parser.parse_args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["DJANGO_SETTINGS_MODULE"] = args.settings
django.setup()
runner = get_runner(settings)(verbosity=args.verbosity, parallel=args.parallel)
sys.exit(bool(runner.run_tests(args.labels)))
"""
DJANGO_TESTS = """\
from django.test import SimpleTestCase

from textops import initials


class InitialsTests(SimpleTestCase):
    def test_two_words(self):
        self.assertEqual(initials("ada lovelace"), "AL")
"""
DJANGO = Fixture(
    instance_id="django__django-90001",
    repo="django/django",
    version="5.0",
    files={
        "pyproject.toml": PYPROJECT.format(name="textops"),
        "textops/__init__.py": 'def initials(name):\n    return "".join(w[0].upper() for w in name.split(" "))\n',
        "tests/runtests.py": DJANGO_RUNTESTS,
        "tests/test_sqlite.py": 'DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3"}}\n'
        'SECRET_KEY = "django_tests_secret_key"\nUSE_TZ = False\n',
        "tests/textops_tests/__init__.py": "",
        "tests/textops_tests/tests.py": DJANGO_TESTS,
    },
    fixed={"textops/__init__.py": 'def initials(name):\n    return "".join(w[0].upper() for w in name.split())\n'},
    tests={
        "tests/textops_tests/tests.py": DJANGO_TESTS
        + '\n    def test_extra_spaces(self):\n        self.assertEqual(initials("ada  lovelace"), "AL")\n'
    },
    fail_to_pass=["test_extra_spaces (textops_tests.tests.InitialsTests.test_extra_spaces)"],
    pass_to_pass=["test_two_words (textops_tests.tests.InitialsTests.test_two_words)"],
    packages=["django==5.0.14", "setuptools==80.9.0"],
    executables=["tests/runtests.py"],
)

SYMPY_BIN_TEST = """\
#!/usr/bin/env python
\"\"\"The repository's tests under SymPy's own runner (sympy.testing.runtests), as sympy's bin/test runs them.\"\"\"
import argparse
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, root)
from sympy.testing.runtests import PyTestReporter, SymPyTests

parser = argparse.ArgumentParser()
parser.add_argument("paths", nargs="*")
parser.add_argument("-C", "--no-cache", action="store_true")
parser.add_argument("-v", "--verbose", action="store_true")
args = parser.parse_args()
reporter = PyTestReporter(verbose=args.verbose, colors=False)
tests = SymPyTests(reporter, seed=0)
tests._root_dir = root
reporter.root_dir(root)
tests._testfiles.extend(os.path.join(root, p) for p in args.paths)
sys.exit(int(not tests.test(sort=True)))
"""
SYMPY_TESTS = """\
from sympy import Rational

from numkit import mean


def test_integers():
    assert mean([1, 2, 3]) == 2
{added}

def test_single():
    assert mean([5]) == 5
"""
SYMPY = Fixture(
    instance_id="sympy__sympy-90001",
    repo="sympy/sympy",
    version="1.13",
    files={
        "pyproject.toml": PYPROJECT.format(name="numkit"),
        "numkit/__init__.py": "from sympy import Integer\n\n\ndef mean(xs):\n    return Integer(sum(xs)) // len(xs)\n",
        "numkit/tests/__init__.py": "",
        "numkit/tests/test_numkit.py": SYMPY_TESTS.format(added=""),
        "bin/test": SYMPY_BIN_TEST,
    },
    fixed={
        "numkit/__init__.py": "from sympy import Integer\n\n\ndef mean(xs):\n    return Integer(sum(xs)) / len(xs)\n"
    },
    tests={
        "numkit/tests/test_numkit.py": SYMPY_TESTS.format(
            added="\n\ndef test_fraction():\n    assert mean([1, 2]) == Rational(3, 2)\n"
        )
    },
    fail_to_pass=["test_fraction"],
    pass_to_pass=["test_integers"],  # not test_single: the last test of a file shares its line with "[OK]", which
    # parse_log_sympy does not read; SWE-bench's own lists leave those tests out the same way
    packages=["sympy==1.13.3", "setuptools==80.9.0"],
    executables=["bin/test"],
)

FIXTURES = (FLASK, DJANGO, SYMPY)


@dataclass
class SmithFixture(Fixture):
    """A SWE-smith instance: the image holds the clean repository (`files`); the row's `patch` brings in the bug
    (`buggy`), and the tests are already in the repository. Its profile (by `repo`) is one the swesmith package
    registers, so its test command and log parser are the package's."""

    buggy: dict[str, str] = field(default_factory=dict)

    @property
    def image(self) -> str:
        from hrl.runners.tasks.swesmith import profile_for

        return str(profile_for({"instance_id": self.instance_id, "repo": self.repo}).image_name)

    def row(self, base_commit: str) -> dict[str, Any]:
        """The instance as a SWE-smith dataset row (test lists as lists, no base_commit or test_patch)."""
        return {
            "instance_id": self.instance_id, "repo": self.repo, "patch": self.patch(self.buggy),
            "FAIL_TO_PASS": self.fail_to_pass, "PASS_TO_PASS": self.pass_to_pass, "image_name": self.image,
            "problem_statement": "quote() no longer percent-encodes spaces.",
        }  # fmt: skip


OAUTHLIB = SmithFixture(
    instance_id="oauthlib__oauthlib.1fd52536.func_pm_remove_assign__hrl0001",
    repo="swesmith/oauthlib__oauthlib.1fd52536",
    version="",
    files={
        "pyproject.toml": PYPROJECT.format(name="oauthlib"),
        "oauthlib/__init__.py": 'def quote(text):\n    return text.replace(" ", "%20")\n\n\n'
        'def unquote(text):\n    return text.replace("%20", " ")\n',
        "tests/test_common.py": "from oauthlib import quote, unquote\n\n\ndef test_quote():\n"
        '    assert quote("a b") == "a%20b"\n\n\ndef test_unquote():\n    assert unquote("a%20b") == "a b"\n',
    },
    fixed={},
    tests={},
    buggy={
        "oauthlib/__init__.py": 'def quote(text):\n    return text.replace(" ", "+")\n\n\n'
        'def unquote(text):\n    return text.replace("%20", " ")\n'
    },
    fail_to_pass=["tests/test_common.py::test_quote"],
    pass_to_pass=["tests/test_common.py::test_unquote"],
    packages=["pytest==8.4.2", "setuptools==80.9.0"],
)


def _context(fixture: Fixture, digest: str, wheels: Path) -> bytes:
    """The build context as a tar: Dockerfile, the conda stand-in, the wheels, the repository."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", fixture.dockerfile(digest).encode())
        add("activate", ACTIVATE.encode())
        for path, text in fixture.files.items():
            add(f"repo/{path}", text.encode())
        for wheel in sorted(wheels.glob("*.whl")):
            add(f"wheels/{wheel.name}", wheel.read_bytes())
    return buf.getvalue()


def _wheels(packages: list[str], dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
    subprocess.run([*cmd, "--python-version", "3.11", "--platform", "any", *packages], check=True, timeout=600)
    return dest


def ensure_images(scratch: Path, fixtures: tuple[Fixture, ...] = FIXTURES) -> list[dict[str, Any]]:
    """Build (or find, by content) each fixture's image; returns their SWE-bench rows, base commits read from the
    images."""
    import docker

    client = docker.from_env(timeout=900)
    rows = []
    try:
        for fixture in fixtures:
            digest = fixture.digest()
            try:
                cached = (client.images.get(fixture.image).labels or {}).get(LABEL) == digest
            except docker.errors.ImageNotFound:
                cached = False
            if not cached:
                wheels = _wheels(fixture.packages, scratch / f"wheels-{digest}")
                context = io.BytesIO(_context(fixture, digest, wheels))
                client.images.build(
                    fileobj=context, custom_context=True, tag=fixture.image, rm=True, forcerm=True, pull=False
                )
            out = client.containers.run(fixture.image, ["git", "-C", "/testbed", "rev-parse", "HEAD~1"], remove=True)
            rows.append(fixture.row(out.decode().strip()))
    finally:
        client.close()
    return rows


def run_eval(task: Any, patch: str = "") -> str:
    """The eval script's output (one stream) in a fresh container of the task's image, `patch` applied first: how
    the logs under fixtures/swebench/ were recorded."""
    import docker

    from hrl.runners.tasks.swebench import command

    script = f"cd /testbed && git apply - <<'HRL_EOF'\n{patch}\nHRL_EOF\n" if patch.strip() else ""
    client = docker.from_env(timeout=900)
    try:
        out = client.containers.run(
            task.image, ["bash", "-c", script + command(task)], remove=True, network_mode="none"
        )
    finally:
        client.close()
    return out.decode()


# R2E-Gym's layout: /testbed holds the repository before the commit (git, its .venv), the instance's test script at
# /testbed/run_tests.sh, its tests at /r2e_tests; the row carries the expected outcomes.
R2E_IMAGE = "hrl-test/r2e_gym_textkit_final:0123456789ab"
R2E_DOCKERFILE = """\
FROM {base}
COPY wheels /opt/wheels
COPY repo /testbed
COPY r2e_tests /r2e_tests
RUN cd /testbed && python3 -m venv .venv \\
 && .venv/bin/pip install -q --no-compile --no-index --find-links /opt/wheels {packages} \\
 && git init -q && git add -A \\
 && git -c user.name=r2e -c user.email=r2e@example.invalid commit -q -m base
LABEL {label}="{digest}"
"""
R2E_FILES = {
    ".gitignore": ".venv/\n",
    "run_tests.sh": ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n",
    "textkit/__init__.py": "def title(text):\n    return text.capitalize()\n\n\ndef shout(text):\n    return text.upper()\n",
}
R2E_FIXED = {
    "textkit/__init__.py": 'def title(text):\n    return " ".join(w.capitalize() for w in text.split(" "))\n\n\n'
    "def shout(text):\n    return text.upper()\n"
}
R2E_TESTS = {
    "test_1.py": "from textkit import shout, title\n\n\nclass TestTitle:\n    def test_words(self):\n"
    '        assert title("ada lovelace") == "Ada Lovelace"\n\n    def test_shout(self):\n'
    '        assert shout("a") == "A"\n'
}
R2E_EXPECTED = {"TestTitle.test_words": "PASSED", "TestTitle.test_shout": "PASSED"}


def to_parsed_commit(diff: str) -> dict[str, Any]:
    """A git diff as R2E-Gym's `ParsedCommit` JSON (its `parse_diff` layout: header, ---/+++ files, hunks)."""
    import re

    files: list[dict[str, Any]] = []
    kinds = {" ": "context", "+": "added", "-": "deleted", "\\": "note"}
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[1]
            files.append(
                {"old_file_content": "", "new_file_content": "", "hunks": [], "header": {"file": {"path": path}}}
            )
        elif line.startswith("--- "):
            files[-1]["minus_file"] = {"path": line[4:]}
        elif line.startswith("+++ "):
            files[-1]["plus_file"] = {"path": line[4:]}
        elif m := re.match(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$", line):
            old, new = (
                {"start": int(m[1]), "length": m[2] and int(m[2])},
                {"start": int(m[3]), "length": m[4] and int(m[4])},
            )
            descriptor = {"old_range": old, "new_range": new, "section": m[5]}
            files[-1]["hunks"].append({"descriptor": descriptor, "line_group": {"all_lines": []}})
        elif files and files[-1]["hunks"]:
            content = line[2:] if line.startswith("\\") else line[1:]
            files[-1]["hunks"][-1]["line_group"]["all_lines"].append({"content": content, "type": kinds[line[:1]]})
    return {"file_diffs": files, "old_commit_hash": "0" * 40, "new_commit_hash": "1" * 40,
            "commit_message": "title() capitalizes every word", "commit_date": "2020-01-01T00:00:00"}  # fmt: skip


def r2e_row() -> dict[str, Any]:
    """The instance as an R2E-Gym dataset row (no instance_id, no FAIL_TO_PASS; JSON fields as strings)."""
    gold = join_patches([file_diff(p, R2E_FILES.get(p), t) for p, t in sorted(R2E_FIXED.items())])
    return {
        "repo_name": "textkit", "docker_image": R2E_IMAGE, "commit_hash": "1" * 40,
        "parsed_commit_content": json.dumps(to_parsed_commit(gold)), "execution_result_content": "{}",
        "modified_files": sorted(R2E_FIXED), "relevant_files": [], "num_non_test_files": 1,
        "problem_statement": "title() capitalizes only the first word.", "prompt": "",
        "expected_output_json": json.dumps(R2E_EXPECTED),
    }  # fmt: skip


def ensure_r2e_image(scratch: Path) -> dict[str, Any]:
    """Build (or find, by content) the R2E-Gym-layout image; returns its row."""
    import docker

    packages = ["pytest==8.4.2"]
    digest = hashlib.sha256(
        "\0".join([BASE_IMAGE, R2E_DOCKERFILE, *packages, json.dumps([R2E_FILES, R2E_TESTS])]).encode()
    ).hexdigest()[:16]
    client = docker.from_env(timeout=900)
    try:
        try:
            cached = (client.images.get(R2E_IMAGE).labels or {}).get(LABEL) == digest
        except docker.errors.ImageNotFound:
            cached = False
        if not cached:
            wheels = _wheels(packages, scratch / f"wheels-{digest}")
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:

                def add(name: str, data: bytes) -> None:
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))

                dockerfile = R2E_DOCKERFILE.format(
                    base=BASE_IMAGE, packages=" ".join(packages), label=LABEL, digest=digest
                )
                add("Dockerfile", dockerfile.encode())
                for path, text in R2E_FILES.items():
                    add(f"repo/{path}", text.encode())
                for path, text in R2E_TESTS.items():
                    add(f"r2e_tests/{path}", text.encode())
                for wheel in sorted(wheels.glob("*.whl")):
                    add(f"wheels/{wheel.name}", wheel.read_bytes())
            buf.seek(0)
            client.images.build(fileobj=buf, custom_context=True, tag=R2E_IMAGE, rm=True, forcerm=True, pull=False)
    finally:
        client.close()
    return r2e_row()
