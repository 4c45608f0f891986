"""Shared pytest configuration: marker checks first, shared fixtures below."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# --------------------------------------------------------------------------------------------------------------
# Marker checks: `docker`, `vllm`, `browser` and `gpu` tests need real components.
#
# `docker`, `vllm` and `browser` skip with the reason when their component is missing, except in CI (the `CI` environment
# variable is set), where .ci/setup.sh must have prepared them and a missing one fails the test. `gpu` always
# skips without `nvidia-smi`. The checks run once per session, and only when such a test is about to run.
# --------------------------------------------------------------------------------------------------------------

SETUP_HINT = 'run .ci/setup.sh (or `make setup`) and `. "$HRL_CACHE/env.sh"`'


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def docker_problem() -> str | None:
    """Why `docker` tests cannot run here, or None when the daemon and the base image are there."""
    image = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
    try:
        import docker
        import docker.errors
    except ImportError:
        return "the `docker` Python package is not installed"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except docker.errors.DockerException as exc:
        return f"no Docker daemon answers ({exc}); {SETUP_HINT}"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"Docker base image {image!r} is missing; {SETUP_HINT}"
    finally:
        client.close()
    return None


@functools.cache
def vllm_problem() -> str | None:
    """Why `vllm` tests cannot run here, or None when HRL_VLLM_PYTHON has vllm."""
    python = os.environ.get("HRL_VLLM_PYTHON")
    if not python:
        return f"HRL_VLLM_PYTHON is not set; {SETUP_HINT}"
    if not os.access(python, os.X_OK):
        return f"HRL_VLLM_PYTHON={python} is not an executable; {SETUP_HINT}"
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([python, "-c", probe], check=False, timeout=60).returncode != 0:
        return f"HRL_VLLM_PYTHON={python} cannot import vllm; {SETUP_HINT}"
    return None


@functools.cache
def browser_problem() -> str | None:
    """Why `browser` tests cannot run here, or None when Chromium and the miniwob package are there."""
    import importlib.util

    if not any(shutil.which(n) for n in (os.environ.get("HRL_CHROMIUM", ""), "chromium", "chromium-browser") if n):
        return f"no Chromium on PATH (apt-get install chromium); {SETUP_HINT}"
    if importlib.util.find_spec("miniwob") is None:
        return f"the miniwob package is not installed (pip install 'hrl[browser]'); {SETUP_HINT}"
    return None


MARKER_CHECKS = {"docker": docker_problem, "vllm": vllm_problem, "browser": browser_problem}


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers = {mark.name for mark in item.iter_markers()}
    if "gpu" in markers and shutil.which("nvidia-smi") is None:
        pytest.skip("needs a GPU (no nvidia-smi on PATH)")
    for name, check in MARKER_CHECKS.items():
        if name in markers and (problem := check()):
            if in_ci():
                pytest.fail(f"[{name}] required in CI: {problem}", pytrace=False)
            pytest.skip(f"[{name}] {problem}")


def pytest_configure(config: pytest.Config) -> None:
    """The `hrl` that the tests' subprocesses import (a CLI run in a temporary folder, an agent's worker) must be this
    checkout's: an editable install made from another checkout sharing $HRL_CACHE (its `make test` reinstalls hrl
    from there) would run that one's code in every subprocess, silently. Checked once, in the main process."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller checked
        return
    here = Path(__file__).resolve().parents[1]
    probe = "import hrl.runners, sys; sys.stdout.write(hrl.runners.__file__)"
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", timeout=60)
    where = Path(got.stdout).resolve().parents[1] if got.returncode == 0 and got.stdout else None
    if where != here:
        found = f"from {where}" if where else f"not at all ({got.stderr.strip()[-300:]})"
        raise pytest.UsageError(
            f"outside this checkout ({here}) Python imports hrl {found}: run `.ci/setup.sh venv` (or `make test`) "
            "here to install this checkout's hrl into the venv"
        )


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    defs = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for fdefs in (defs.name2fixturedefs.values() if defs else ()) for d in fdefs}
    return bool(scopes & {"module", "class", "package"})


# --------------------------------------------------------------------------------------------------------------
# The time budget per test file: tests/durations.json holds each file's seconds in a fresh CI run on 2 cores. The
# files are handed out longest first (so that none starts last and runs alone), and the run ends with the files that
# took much longer than their budget: which file grew, said where the run's time is. Never a failure: a test's
# verdict does not depend on the machine's speed. HRL_DURATIONS_OUT=FILE writes this run's figures in that form.
# --------------------------------------------------------------------------------------------------------------

BUDGET_FILE = Path(__file__).with_name("durations.json")
GREW_FACTOR, GREW_MIN_S = 1.5, 20.0  # over budget: 1.5 × its seconds and 20 s more (load on 2 cores is noisy)
_file_seconds: dict[str, float] = {}


def _budget() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(BUDGET_FILE.read_text()).items()}
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files start first. `make test` runs the suite with `pytest -n N --dist loadfile` (a file's tests
    in one worker, so its module fixtures start once, and the files handed out in this order): by their budget
    (tests/durations.json), then, for a file it does not know yet, by its longest `slow` test's timeout; within a
    module its `slow` tests that share no module fixture lead, by their timeout. A module's tests stay together (a
    module fixture must not start twice); the rest keep their order."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    def timeout(item: pytest.Item) -> float:
        mark = item.get_closest_marker("timeout")
        return float(mark.args[0]) if mark and mark.args else 0.0

    slow: dict[str, float] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            slow[module(item)] = max(slow.get(module(item), 0.0), timeout(item))
    longest = slow | _budget()  # a measured time wins over a timeout
    order = {m: k for k, m in enumerate(dict.fromkeys(module(i) for i in items))}

    def key(item: pytest.Item) -> tuple[float, int, float]:
        lead = item.get_closest_marker("slow") is not None and not _shares_a_module_fixture(item)
        return (-longest.get(module(item), -1.0), order[module(item)], -timeout(item) if lead else 0.0)

    items.sort(key=key)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each file's time: its tests' set-up, call and tear-down (with xdist, the controller sees every worker's)."""
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + float(report.duration or 0.0)


def _report_budget(terminalreporter: Any) -> None:
    if not _file_seconds:
        return
    budget = _budget()
    grew = [(f, s, budget[f]) for f, s in _file_seconds.items()
            if f in budget and s > budget[f] * GREW_FACTOR and s > budget[f] + GREW_MIN_S]  # fmt: skip
    new = [(f, s) for f, s in _file_seconds.items() if f not in budget and s > GREW_MIN_S]
    terminalreporter.write_sep("=", f"time per test file (budget: {BUDGET_FILE.name}; slowest 15)")
    for f, s in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{s:>7.1f}s  budget {budget.get(f, 0.0):>6.1f}s  {f}")
    for f, s, b in sorted(grew, key=lambda row: row[2] - row[1]):
        terminalreporter.write_line(f"GREW: {f} took {s:.0f} s, over its budget of {b:.0f} s")
    for f, s in sorted(new, key=lambda row: -row[1]):
        terminalreporter.write_line(f"NEW: {f} took {s:.0f} s and has no budget yet")
    if out := os.environ.get("HRL_DURATIONS_OUT"):
        figures = {f: round(s, 1) for f, s in sorted(_file_seconds.items())}
        Path(out).write_text(json.dumps(figures, indent=0, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print each test file's time against its budget, and the set-up phases of this run (`.ci/setup.sh` writes
    them; `make test` names the file in HRL_SETUP_PHASES) beside pytest's `--durations`, so that a run that grows
    shows where."""
    _report_budget(terminalreporter)
    path = os.environ.get("HRL_SETUP_PHASES")
    if not path or not Path(path).is_file():
        return
    terminalreporter.write_sep("=", "set-up phases (.ci/setup.sh, seconds)")
    for line in Path(path).read_text().splitlines():
        name, seconds, status = [*line.split("\t"), "", ""][:3]
        terminalreporter.write_line(f"{seconds:>6}s  {name:<12} {status}")


def covering(values: list[str], full: list[str]) -> list[Any]:
    """A matrix's parameters with those in `full` marked for the full tier (`make test-full`): CI runs the rest, a
    covering subset (each value left out has its code path covered by one kept, said where it is used)."""
    return [pytest.param(v, marks=pytest.mark.full) if v in full else v for v in values]


def install_agent(name: str, target: str) -> None:
    """Install an agent CLI for an `agents` test: a failed install fails in CI and skips with the reason elsewhere."""
    from hrl.runners.agents.install import install
    from hrl.runners.errors import PrerequisiteError

    try:
        install(name, target, timeout_s=900)  # type: ignore[arg-type]
    except PrerequisiteError as e:
        if in_ci():
            pytest.fail(f"[agents] install of {name} required in CI: {e} ({e.hint})", pytrace=False)
        pytest.skip(f"[agents] cannot install {name}: {e}")


# --------------------------------------------------------------------------------------------------------------
# Shared fixtures
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for a module whose engines live across its tests (their HTTP sessions are bound to it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny chat model (hrl models tiny, seed 0) built once per test session."""
    from hrl.train.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """`family_model(NAME)`: the tiny model built as family NAME (hrl models tiny --family), once per session."""
    from hrl.train.tiny import build_tiny_model

    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            out = tmp_path_factory.mktemp("models") / f"tiny-{family}"
            built[family] = str(build_tiny_model(out, seed=0, family=family))
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_lora(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.models import make_lora

    return str(make_lora(tiny_model, tmp_path_factory.mktemp("lora") / "adapter"))


@pytest.fixture(scope="session")
def tiny_full(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.models import make_full

    return str(make_full(tiny_model, tmp_path_factory.mktemp("full") / "ckpt"))


@pytest.fixture(scope="session")
def swe_image() -> str:
    """The grading image (Python + pytest), built once per machine and cached by tag."""
    from hrl.runners.tasks.sandbox_images import SWE_IMAGE, ensure_image

    ensure_image()
    return SWE_IMAGE


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """Ray for the tests of a module that need it, shared by them (down at the module's end: its idle daemons would
    take CPU from every test after): `ray.cluster_utils.Cluster` with two simulated nodes of
    one CPU each (num_cpus=2 in all: this machine's), the test process its driver. At the end Ray is shut down and
    no process it started may be left."""
    import ray
    from ray.cluster_utils import Cluster

    before = _descendants(os.getpid())
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        deadline = time.monotonic() + 30
        while (left := _descendants(os.getpid()) - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"Ray processes left after shutdown: {sorted(left)}"
