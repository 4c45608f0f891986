"""The Python a white-box agent runs in: hrl's own, or one of its own (`rollout.python`).

An agent library whose pinned dependencies hrl's environment cannot take (browser-use pins exact versions of
pydantic, anthropic, protobuf and some thirty more) runs in a venv of its own, as it is deployed. `rollout.python`:

- empty (default): hrl's interpreter, with hrl's `sys.path`;
- the name of a Python agent hrl installs (`hrl agents ls`: browser-use, mini-swe-agent, aider): its pinned venv for
  the local sandbox, installed on first use like the CLIs (`hrl agents install NAME --target local`);
- a path to a Python (a venv's `bin/python`): the agent imports that environment's packages.

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

__all__ = ["AgentPython", "agent_python", "check_python", "client_root"]

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
    if getattr(runner, "package_kind", "") != "pypi":
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
