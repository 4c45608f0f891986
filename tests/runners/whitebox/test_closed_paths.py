"""A closed white-box agent sees what it needs wherever it lives: a checkout of hrl, the agent's file and a venv
under /tmp (which the agent's namespace replaces with a temp folder of its own) are bound in read-only, and what
cannot be bound is refused before anything starts, naming the path."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hrl.runners.errors import UsageError
from hrl.runners.trace import read_traces
from hrl.runners.whitebox.interpreter import agent_python, closed_mounts
from hrl.sandboxes.local import LocalBackend

ROOT = Path(__file__).resolve().parents[3]
AGENT = """
async def run(task, session):
    import hrl, pathlib
    await session.openai(max_retries=0).chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": task.problem_statement}], max_tokens=4)
    return 1.0 if str(pathlib.Path(hrl.__file__).resolve()).startswith(CHECKOUT) else 0.0  # kept as the trace's agent_reward
"""


def _venv_seeing_hrls_packages(where: Path) -> Path:
    """A bare venv under `where` whose site-packages reach hrl's environment's packages through a .pth line (pydantic,
    aiohttp, openai) but not hrl itself: hrl reaches it only through `client_root`'s link, as for an agent's venv."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(where), "platbase": str(where)}))
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / "hrl_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return where / "bin" / "python"


def _checkout_copy(where: Path) -> Path:
    """This checkout's source, copied under `where` (a temp folder), the heavy recipes left out."""
    shutil.copytree(ROOT, where, ignore=shutil.ignore_patterns(".git", "tests", "bench", "docs", "demo", "swe",
                                                               "__pycache__", "ci-artifacts", "runs"))  # fmt: skip
    return where


@pytest.mark.timeout(600)
def test_a_checkout_an_agent_and_a_venv_under_tmp_reach_the_closed_agent(tmp_path: Path, tiny_model: str) -> None:
    assert LocalBackend().isolate, "bubblewrap is needed (.ci/setup.sh installs it)"
    assert str(tmp_path).startswith("/tmp/") or tmp_path.is_relative_to(Path(os.environ.get("TMPDIR", "/tmp")))
    checkout = _checkout_copy(tmp_path / "checkout")  # each in a folder of its own: none shows another
    python = _venv_seeing_hrls_packages(tmp_path / "venv")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.py").write_text(f"CHECKOUT = {str(checkout)!r}\n{AGENT}")
    (tmp_path / "work").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "hrl.cli", "rollout", "--recipe", "langgraph-react", "--agent",
         f"{tmp_path}/agent/agent.py:run", "--model", tiny_model, "--limit", "1", "--out", "t.jsonl",
         "-c", "rollout.mode=subprocess", "-c", f"rollout.python={python}"],
        capture_output=True, text=True, timeout=500, cwd=tmp_path / "work",
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(checkout)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (trace,) = read_traces(tmp_path / "work" / "t.jsonl")
    assert trace["failure_reason"] is None and len(trace["calls"]) == 1, trace["metadata"]
    assert trace["agent"]["version"] == "subprocess"
    assert trace["metadata"]["agent_reward"] == 1.0  # the agent imported the copy under /tmp, not another hrl


def test_what_cannot_be_bound_is_refused_naming_the_path(tmp_path: Path) -> None:
    """An agent file directly in a hidden folder: binding that folder would show every other sandbox."""
    (tmp_path / "agent.py").write_text(AGENT)
    own = agent_python("")
    with pytest.raises(UsageError, match=f"needs {tmp_path}, which holds the temp folder"):
        closed_mounts(own, tmp_path / "agent.py", str(tmp_path), [tmp_path / "sandboxes", tmp_path])
    mounts = closed_mounts(own, tmp_path / "agent.py", str(tmp_path), [tmp_path.parent])
    assert str(tmp_path) in mounts  # the agent's folder, under a hidden one, is bound in
