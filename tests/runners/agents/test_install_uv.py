"""Agents' Python venvs are filled by uv where a uv binary is found (its own cache copy first), never by a shim
script that a container could not run, and by pip when asked to or when there is no uv."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hrl.runners.agents import install


def _executable(path: Path, head: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"\0" * 16)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_uv_is_the_caches_binary_not_a_shim_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HRL_INSTALL_WITH_PIP", raising=False)
    shim = _executable(tmp_path / "bin" / "uv", b"#!/bin/sh\n")
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}/usr/bin:/bin")
    assert install._uv() is None  # a script on PATH: a container cannot run it
    real = _executable(tmp_path / "cache" / "uv" / "bin" / "uv", b"\x7fELF")
    assert install._uv() == str(real.resolve())
    monkeypatch.setenv("HRL_INSTALL_WITH_PIP", "1")
    assert install._uv() is None


def test_the_docker_venv_mounts_uv_and_falls_back_to_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HRL_INSTALL_WITH_PIP", raising=False)
    real = _executable(tmp_path / "cache" / "uv" / "bin" / "uv", b"\x7fELF")
    seen: list[list[str]] = []
    monkeypatch.setattr(install.shutil, "which", lambda name: "/usr/bin/docker" if name == "docker" else None)
    monkeypatch.setattr(install, "_run", lambda cmd, *a, **k: seen.append(cmd))
    monkeypatch.setattr(install.subprocess, "run", lambda *a, **k: None)  # the `docker rm -f` afterwards
    install._docker_venv(tmp_path / "d" / "docker", "/opt/hrl/agents/x", "x==1", 60, tmp_path / "log")
    (cmd,) = seen
    assert f"{real.resolve()}:/opt/hrl-uv/uv:ro" in cmd
    script = cmd[-1]
    assert script.index("/opt/hrl-uv/uv pip install") < script.index("|| /opt/hrl/agents/x/venv/bin/pip install")
