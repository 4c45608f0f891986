"""Checks of what hrl can use on this machine. Each check returns (ok, detail); nothing here raises."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Check", "run_checks", "tool_parser_check", "tool_prompt_check"]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required_for: str
    blocking: bool = True  # False: a finding to act on (a model that calls no tool), not a missing prerequisite
    figures: dict[str, Any] = field(default_factory=dict)  # what a check measured, for --json


def _module(name: str) -> tuple[bool, str]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False, "not installed"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return True, version(name)
    except PackageNotFoundError:
        return True, "installed"


def _docker() -> tuple[bool, str]:
    if not shutil.which("docker"):
        return False, "docker client not found"
    try:
        out = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return False, "docker info timed out"
    if out.returncode != 0:
        return False, "daemon not reachable: " + (out.stderr.strip().splitlines() or ["?"])[-1][:120]
    return True, f"daemon {out.stdout.strip()}"


def _vllm() -> tuple[bool, str]:
    from hrl.runners.engines.vllm_server import vllm_python  # imports aiohttp

    py = vllm_python()
    if py is None:
        return False, "no vllm here; set HRL_VLLM_PYTHON to a python that has vllm"
    probe = "import importlib.util as u; print('ok' if u.find_spec('vllm') else 'missing')"
    try:
        res = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{py}: {e}"
    if res.stdout.strip() != "ok":
        return False, f"{py} has no vllm"
    return True, py


CHECKS: list[tuple[str, Callable[[], tuple[bool, str]], str]] = [
    ("torch", lambda: _module("torch"), "hrl train, embedded engine"),
    ("transformers", lambda: _module("transformers"), "tokenizers, chat templates, models"),
    ("peft", lambda: _module("peft"), "LoRA training and publishing"),
    ("docker", _docker, "docker sandboxes"),
    ("vllm", _vllm, "--engine vllm"),
]


def run_checks() -> list[Check]:
    return [Check(name, *fn(), required_for) for name, fn, required_for in CHECKS]


def tool_prompt_check(model: str, choice: str = "auto") -> Check:
    """Whether `model`'s chat template shows a request's tools, and where it cannot, what the proxy does with them
    (`proxy.tool_prompt`: shows them in the hermes tool prompt, or refuses them). Refused is a finding (`!`): an
    agent's requests get a 400. figures: shows_tools, tool_prompt (the prompt the proxy adds, if any)."""
    from hrl.runners.models import split_adapter
    from hrl.runners.proxy.toolprompt import model_shows_tools, tool_prompt_note

    need = f"tools of {model}"
    try:
        shows = model_shows_tools(split_adapter(model)[0])
    except Exception as e:  # no tokenizer to load: the tool parser check or the probe says what is wrong
        return Check("tool prompt", False, f"not checked: {type(e).__name__}: {str(e)[:200]}", need, blocking=False)
    refused = not shows and choice == "refuse"
    figures = {"shows_tools": shows, "tool_prompt": None if shows or refused else "hermes"}
    return Check("tool prompt", not refused, tool_prompt_note(shows, choice), need, blocking=False, figures=figures)


def tool_parser_check(model: str, choice: str = "auto", shows_tools: bool = True) -> Check:
    """Which tool-call parser the proxy uses for `model` (a local model dir, or a LoRA checkpoint of one);
    `shows_tools` False: its template cannot show tools, so `auto` reads the hermes tool prompt's calls."""
    from hrl.runners.errors import HrlError
    from hrl.runners.models import split_adapter
    from hrl.runners.proxy.toolparsers import check_name, detect_model

    try:
        base, _ = split_adapter(model)
        check_name(choice)
        name = detect_model(base) if choice == "auto" else choice
    except HrlError as e:
        return Check("tool parser", False, str(e), f"tool calls of {model}")
    how = "detected from its chat template and config.json" if choice == "auto" else "as configured"
    if choice == "auto" and not shows_tools:
        name, how = "hermes", "its chat template cannot show tools: the hermes tool prompt's format"
    return Check("tool parser", True, f"{name} ({how})", f"tool calls of {model}")
