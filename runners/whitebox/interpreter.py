"""The Python a white-box agent runs in: hrl's own, or one of its own (`rollout.python`).

An agent library whose pinned dependencies hrl's environment cannot take (browser-use pins exact versions of
pydantic, anthropic, protobuf and some thirty more) runs in a venv of its own, as it is deployed. `rollout.python`:

- empty (default): hrl's interpreter, with hrl's `sys.path`;
- the name of a Python agent hrl installs (`hrl agents ls`: browser-use, mini-swe-agent, aider): its pinned venv for
  the local sandbox, installed on first use like the CLIs (`hrl agents install NAME --target local`);
- a path to a Python (a venv's `bin/python`): the agent imports that environment's packages.

A closed agent (a subprocess under bubblewrap) sees the host's files read-only but its own temp folder: what it needs
from a temp folder (a checkout under /tmp, the agent's file, a venv there) is bound in read-only (`closed_mounts`),
and what cannot be bound is refused before any episode, naming the path.

In another interpreter the agent runs as `rollout.mode: subprocess` does, and hrl's worker and client come from this
hrl's own source files: the `hrl` package is found through a folder holding one link to it (`client_root`), so
that interpreter sees hrl and none of hrl's environment. The worker needs `pydantic` (2.x) and `aiohttp` there
(the task model and the session client); `check_python` says so before any episode when they are missing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hrl.runners.errors import PrerequisiteError, UsageError

__all__ = ["AgentPython", "agent_python", "check_python", "client_root", "closed_mounts"]

CHECK_TIMEOUT_S = 120.0  # importing an agent library (browser-use: ~2 s here) and its module


@dataclass(frozen=True)
class AgentPython:
    """An interpreter for white-box agents and the import path it is given (PYTHONPATH)."""

    python: str
    paths: tuple[str, ...]
    own: bool  # hrl's own interpreter (hrl's sys.path), else one of the agent's


def agent_python(value: str = "", on_event: Callable[[str], None] | None = None) -> AgentPython:
    """The interpreter `rollout.python` names (see the module docstring); installs a named agent's venv on first
    use. Raises UsageError for a path that is not an executable, PrerequisiteError for a failed install."""
    value = value.strip()
    if not value:
        return AgentPython(sys.executable, tuple(p for p in sys.path if p), own=True)
    path = Path(value).expanduser()
    if "/" not in value:
        path = _installed_python(value, on_event)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"rollout.python {value!r} is no executable Python",
                         hint="give a venv's bin/python, or a Python agent hrl installs (`hrl agents ls`: "
                         "browser-use, mini-swe-agent, aider)")  # fmt: skip
    absolute = str(path.absolute())  # not resolved: a venv's python is a link whose own path makes it the venv's
    if absolute == sys.executable:
        return agent_python("")
    return AgentPython(absolute, (str(client_root()), str(Path.cwd())), own=False)


def _installed_python(name: str, on_event: Callable[[str], None] | None) -> Path:
    from hrl.runners.agents import get_agent
    from hrl.runners.agents.install import install

    runner = get_agent(name)
    if runner.package_kind != "pypi":
        raise UsageError(f"rollout.python {name!r} is an agent CLI, not a Python agent hrl installs a venv for",
                         hint="name browser-use, mini-swe-agent or aider, or give a path to a Python")  # fmt: skip
    done = install(name, "local", on_event=on_event)  # a no-op once installed
    return Path(done.host_dir) / "venv" / "bin" / "python"


def client_root() -> Path:
    """A folder holding only a link named `hrl` to this hrl's package: on another interpreter's path it makes hrl's
    modules importable (from this checkout or install) without hrl's environment. Kept in hrl's cache, one per hrl
    location; made atomically, so concurrent runs agree."""
    import hrl
    from hrl.runners.agents.install import agents_cache

    package = Path(hrl.__file__).resolve().parent
    root = agents_cache().parent / "python-path" / hashlib.sha256(str(package).encode()).hexdigest()[:12]
    link = root / "hrl"
    if link.is_symlink() and link.resolve() == package:
        return root
    root.mkdir(parents=True, exist_ok=True)
    staged = root / f".hrl-{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(package, target_is_directory=True)
    staged.replace(link)
    return root


@functools.cache
def check_python(where: AgentPython, spec: str, base_dir: str | None) -> None:
    """Load the agent's function in its own interpreter, as its worker will: raises PrerequisiteError naming what
    is missing there (hrl's worker needs pydantic and aiohttp; the agent, its own imports). Once per process for
    an interpreter and agent that loaded (`hrl rollout` checks before the engine starts, the rollouts again)."""
    if where.own:
        return
    probe = ("import sys; from hrl.runners.whitebox.harness import load_function; "
             "load_function(sys.argv[1], sys.argv[2] or None)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(where.paths)}
    try:
        out = subprocess.run([where.python, "-c", probe, spec, base_dir or ""], capture_output=True, text=True,
                             env=env, timeout=CHECK_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PrerequisiteError(f"the agent's Python {where.python} did not run: {e}") from e
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise PrerequisiteError(f"{spec} does not load in its Python {where.python}: {tail[0]}",
                                hint="hrl's worker needs pydantic (2.x) and aiohttp there; the agent, its own "
                                "imports (pip install them into that venv)")  # fmt: skip


def closed_mounts(where: AgentPython, target: str | Path, base_dir: str | None, hidden: list[Path]) -> list[str]:
    """The host folders a closed agent's process needs that its namespace would hide (`hidden`: the local backend's
    `private_roots`, the temp folders among them), to bind in read-only at the same paths: hrl's source (a checkout
    under /tmp), the interpreter's environment, its import path, the agent's file's folder or module, the base
    folder. Raises UsageError naming a needed path that cannot be bound: one that is itself a hidden folder or
    holds one (an agent file directly in /tmp: binding /tmp would show every other sandbox). `target`: the agent's
    file (a Path) or module name, as `harness.split_spec` gives it."""
    import hrl

    needed = {*hrl.__path__, *_environment(where.python)}  # hrl's package (and a checkout's root), the interpreter's
    needed.add(str(Path(target).parent) if isinstance(target, Path) else _module_home(target, where))
    optional = {*where.paths, str(Path(base_dir or ".").absolute())}  # a folder on the import path: only if it can
    mounts: set[Path] = set()
    for path, must in [*((p, True) for p in needed if p), *((p, False) for p in optional if p and p not in needed)]:
        for form in {Path(path).absolute(), Path(path).resolve()}:  # a link's own path, and what it points to
            if not form.exists() or not any(form.is_relative_to(h) for h in hidden):
                continue
            if any(h.is_relative_to(form) for h in hidden):
                if not must:
                    continue
                raise UsageError(f"the closed agent needs {form}, which holds the temp folder a sandbox has its own "
                                 "of: it cannot be shown to the agent's namespace",
                                 hint="move the agent (or hrl) into a folder of its own, or set rollout.mode: "
                                 "inprocess for a trusted agent")  # fmt: skip
            mounts.add(form)  # a folder, or a module's one file
    top = sorted(mounts, key=lambda p: len(p.parts))
    return [str(p) for i, p in enumerate(top) if not any(p.is_relative_to(q) for q in top[:i])]


def _environment(python: str) -> list[str]:
    """An interpreter's own folders: its venv (the link's folder's parent holding pyvenv.cfg) and where the
    executable really lives (a base Python a venv links to)."""
    path = Path(python).absolute()
    out = [str(path.resolve().parent.parent)]
    if (path.parent.parent / "pyvenv.cfg").is_file():
        out.append(str(path.parent.parent))
    return out


def _module_home(module: str, where: AgentPython) -> str:
    """The folder an agent's module (MODULE:FUNCTION) is imported from: its top-level package's folder, found on
    the interpreter's import path as the worker will find it; "" where it is not found here (the worker says so)."""
    import importlib.machinery

    top = module.split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, [*where.paths, *sys.path] if where.own else list(where.paths))
    if found is None or found.origin in (None, "built-in", "frozen"):
        return ""
    origin = Path(found.origin)
    return str(origin.parent.parent if origin.name == "__init__.py" else origin)
